"""`shardlab token create|list|revoke`: API tokens for scripts and CI, from the server host."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shardlab.cli.common import JsonFlag, app

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

token_app = typer.Typer(
    help="API tokens (sent as 'Authorization: Bearer <token>'); only their hashes are stored.",
    no_args_is_help=True,
)
app.add_typer(token_app, name="token")

TeamOption = Annotated[str, typer.Option("--team", help="The team the token acts for.")]


def _sessions() -> sessionmaker[Session]:
    """Sessions on the migrated service database; exit 1 when it is not migrated."""
    from backend import migrate
    from backend.db import make_engine, session_factory
    from backend.settings import Settings

    url = Settings.from_env().database_url
    try:
        revision = migrate.current(url)
    except Exception as exc:
        typer.echo(f"error: cannot open the database: {exc}", err=True)
        raise typer.Exit(1) from None
    if revision is None:
        typer.echo("error: the database is not migrated; run `shardlab db upgrade`", err=True)
        raise typer.Exit(1)
    return session_factory(make_engine(url))


@token_app.command()
def create(
    team: TeamOption,
    name: Annotated[str, typer.Option("--name", help="A name to tell the token apart.")],
    user: Annotated[
        str | None,
        typer.Option("--user", help="Act as this member of TEAM (reviews are by people)."),
    ] = None,
    expires_in_days: Annotated[
        int | None,
        typer.Option(
            "--expires-in-days", min=1, max=3650, help="Expire after N days (default: never)."
        ),
    ] = None,
) -> None:
    """Create a token for TEAM (created if missing), or for one of its members with --user;
    prints only the secret, once."""
    from datetime import timedelta

    from sqlalchemy import select

    from backend.auth import create_token, ensure_team
    from backend.db import transaction
    from backend.orm import User

    factory = _sessions()
    with transaction(factory, immediate=True) as session:
        team_id = ensure_team(session, team).id
        user_id = None
        if user is not None:
            user_id = session.scalar(select(User.id).where(User.team_id == team_id,
                                                           User.name == user))  # fmt: skip
            if user_id is None:
                typer.echo(f"error: team {team!r} has no member {user!r} (admins add people "
                           "with POST /api/admin/users)", err=True)  # fmt: skip
                raise typer.Exit(1)
        expires_at = None
        if expires_in_days is not None:
            expires_at = datetime.now(UTC) + timedelta(days=expires_in_days)
        secret = create_token(session, team_id, name, user_id=user_id, expires_at=expires_at)
    typer.echo(secret)


@token_app.command("list")
def list_tokens(team: TeamOption, as_json: JsonFlag = False) -> None:
    """The team's tokens (never the secrets), revoked ones included."""
    from sqlalchemy import select

    from backend.orm import ApiToken, Team

    factory = _sessions()
    with factory() as session:
        rows = session.execute(
            select(ApiToken).join(Team, Team.id == ApiToken.team_id).where(Team.name == team)
        ).scalars()
        tokens = [
            {
                "id": t.id,
                "name": t.name,
                "prefix": t.prefix,
                "created_at": _iso(t.created_at),
                "revoked_at": _iso(t.revoked_at) if t.revoked_at else None,
                "expires_at": _iso(t.expires_at) if t.expires_at else None,
            }
            for t in sorted(rows, key=lambda t: t.id)
        ]
    if as_json:
        typer.echo(json.dumps(tokens, indent=2))
        return
    for t in tokens:
        state = _state(t)
        typer.echo(f"{t['id']:>5}  {t['prefix']}...  {t['name']:<24} {state}")


@token_app.command()
def revoke(token_id: Annotated[int, typer.Argument(metavar="ID", help="The token's id.")]) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    from backend.db import transaction
    from backend.orm import ApiToken

    factory = _sessions()
    with transaction(factory, immediate=True) as session:
        token = session.get(ApiToken, token_id)
        if token is None:
            typer.echo(f"error: no token with id {token_id}", err=True)
            raise typer.Exit(1)
        if token.revoked_at is None:
            token.revoked_at = datetime.now(UTC)
    typer.echo(f"token {token_id} revoked", err=True)


def _state(token: dict[str, Any]) -> str:
    """How `token list` describes a token: revoked, expired, expiring, or active."""
    if token["revoked_at"]:
        return f"revoked {token['revoked_at']}"
    expires = token["expires_at"]
    if expires is None:
        return "active"
    if datetime.fromisoformat(expires) <= datetime.now(UTC):
        return f"expired {expires}"
    return f"active, expires {expires}"


def _iso(moment: datetime) -> str:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()
