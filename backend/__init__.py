"""The Shardlab web service (FastAPI). Never imports torch; never runs jobs itself."""
