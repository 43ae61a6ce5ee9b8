"""The published recipes' own figures: what Megatron-LM's tensor and sequence parallelism,
its activation recomputation and its mixed-precision optimizer cost per transformer layer.

A template's plan must equal its recipe at the shapes people train at; this module writes
the recipe down independently of the planner (formulas from the papers, not from the plan),
so tests and benchmarks can hold plans against it:

- `layer_collectives`: the tensor-parallel collectives one layer moves per micro-batch
  (Shoeybi et al. 2019: 2 all-reduces forward, 2 backward; Korthikanti et al. 2022: each
  becomes an all-gather and a reduce-scatter with sequence parallelism, and the backward
  gathers the norm output again for the weight gradient, as Megatron-LM's
  `LinearWithGradAccumulationAndAsyncCommunication` does);
- `activation_bytes`: bytes one layer keeps for the backward (Korthikanti et al. 2022,
  Table 2: sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34/t + 5as/(ht)) with
  sequence parallelism, for the GPT layer with dropout and unfused attention), the same
  accounting applied to the Llama layer (RMSNorm, SwiGLU, grouped-query attention, no
  dropout), with a fused (flash) kernel (no [b, a, s, s] tensor kept) and recomputation;
- `model_state_bytes_per_param`: Megatron-LM's mixed-precision accounting (bf16 params,
  fp32 main gradients, fp32 master params and Adam moments: 18 bytes; the distributed
  optimizer divides the 12 optimizer bytes over data parallelism), and FSDP2's (all 18
  divided).

Sizes: s sequence, b micro-batch (per data-parallel rank), h hidden, a heads, g kv heads,
f ffn, t tensor-parallel size; 16-bit activations (2 bytes), 1-byte dropout masks.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes of a 16-bit activation and of a dropout mask element.
HALF, MASK = 2, 1


@dataclass(frozen=True, slots=True)
class Layer:
    """One transformer layer's sizes and how it is built and split."""

    family: str  # "gpt" (LayerNorm, GeLU MLP, biases) or "llama" (RMSNorm, SwiGLU, GQA)
    s: int  # sequence length
    b: int  # micro-batch per data-parallel rank
    h: int  # hidden size
    a: int  # attention heads
    g: int  # kv heads
    f: int  # ffn size
    t: int = 1  # tensor-parallel size
    dropout: bool = False  # hidden and attention-probability dropout (GPT)
    attention: str = "flash"  # "flash" (fused kernel) or "eager" (scores kept)

    @property
    def sbh(self) -> int:
        return self.s * self.b * self.h

    @property
    def kv_replicated(self) -> bool:
        """Fewer kv heads than tensor-parallel ranks: the k/v projections stay replicated."""
        return self.g % self.t != 0


def layer_collectives(
    layer: Layer, sequence_parallel: bool, recompute: str = "none"
) -> dict[str, tuple[int, float]]:
    """Per collective kind: how many the layer runs on the tensor-parallel axis per
    micro-batch, forward and backward, and the bytes one rank moves in all (ring
    algorithm: an all-reduce moves 2(t-1)/t of the tensor, a gather or scatter (t-1)/t).

    Tensor parallelism: the o and down projections' partial sums are all-reduced (2 in the
    forward); in the backward so are the input gradients of the column-parallel q/k/v and
    gate/up projections (2). With sequence parallelism each all-reduce becomes a
    reduce-scatter and an all-gather; the backward also gathers the two norm outputs again
    for the column-parallel weight gradients. Full recomputation replays the forward's
    collectives (and its gathers serve the weight gradients). With replicated k/v
    projections their partial input gradients are all-reduced too (2 more, of size g/a).
    """
    t = layer.t
    if t == 1:
        return {}
    act = HALF * layer.sbh
    ring = (t - 1) / t
    replay = recompute == "full"
    out: dict[str, tuple[int, float]] = {}
    if sequence_parallel:
        gathers = 2 + 2 + 2  # norm outputs (forward), gradients (backward), norm outputs again
        scatters = 2 + 2 + (2 if replay else 0)
        out["all_gather"] = (gathers, gathers * ring * act)
        out["reduce_scatter"] = (scatters, scatters * ring * act)
    else:
        reduces = 2 + 2 + (2 if replay else 0)
        out["all_reduce"] = (reduces, reduces * 2 * ring * act)
    if layer.kv_replicated:
        count, size = out.get("all_reduce", (0, 0.0))
        kv = act * layer.g / layer.a
        out["all_reduce"] = (count + 2, size + 2 * 2 * ring * kv)
    return out


def activation_bytes(layer: Layer, sequence_parallel: bool, recompute: str = "none") -> int:
    """Bytes one layer keeps for the backward on one rank, per micro-batch (module doc).

    Charged to the layer that makes them: a layer's own output (the next layer's input)
    counts for it, its input for the layer before.
    """
    t, sbh = layer.t, layer.sbh
    if recompute == "full":
        return HALF * sbh // (t if sequence_parallel else 1)
    if layer.family == "gpt":
        outside, inside, whole = *_gpt_terms(layer), 0
    else:
        outside, inside, whole = _llama_terms(layer, sequence_parallel)
    scores = 0 if recompute == "selective" else _scores(layer)
    if sequence_parallel:  # the regions outside attention and MLP are sequence-sharded
        return (outside + inside + scores) // t + whole
    return outside + whole + (inside + scores) // t


def _gpt_terms(layer: Layer) -> tuple[int, int]:
    """Korthikanti et al.'s 10sbh (outside the tensor-parallel regions: two LayerNorm inputs,
    the QKV and first-MLP inputs, two dropout masks) and 24sbh (inside: q and k, v, the
    o_proj input, the GeLU input and output) for ffn = 4h; general ffn here."""
    sbh, sbf = layer.sbh, layer.s * layer.b * layer.f
    masks = 2 * MASK * sbh if layer.dropout else 0
    outside = 4 * HALF * sbh + masks  # LayerNorm inputs (2) and outputs (2): 8sbh (+2 masks)
    inside = 4 * HALF * sbh + 2 * HALF * sbf  # q, k, v, o_proj input; GeLU in and out
    return outside, inside


def _llama_terms(layer: Layer, sequence_parallel: bool) -> tuple[int, int, int]:
    """The same accounting for the Llama layer: RMSNorm inputs and outputs outside (8sbh);
    inside q, k and v (or, eager, their per-head copies with the kv heads repeated), the
    o_proj input, and SwiGLU's gate and up outputs, the SiLU output and the down_proj input
    (8sbf). Replicated k/v projections keep k and v whole on every rank (the third term),
    unless sequence parallelism lets them run on the rank's sequence shard."""
    sbh, sbf = layer.sbh, layer.s * layer.b * layer.f
    kv = 2 * HALF * sbh * layer.g // layer.a  # k and v with g heads
    replicated = layer.kv_replicated and layer.attention != "eager" and not sequence_parallel
    whole = kv if replicated else 0
    heads = 3 * HALF * sbh if layer.attention == "eager" else HALF * sbh + kv - whole
    inside = heads + HALF * sbh + 4 * HALF * sbf
    return 4 * HALF * sbh, inside, whole


def _scores(layer: Layer) -> int:
    """The [b, a, s, s] tensors unfused attention keeps: the softmax output (2as^2b) and,
    with dropout, its mask (as^2b) and output (2as^2b): Korthikanti et al.'s 5as^2b."""
    if layer.attention != "eager":
        return 0
    as2b = layer.a * layer.s * layer.s * layer.b
    return (HALF + MASK + HALF) * as2b if layer.dropout else HALF * as2b


#: the recipes `model_state_bytes_per_param` knows
STATE_RECIPES = ("megatron", "distributed_optimizer", "fsdp2")


def model_state_bytes_per_param(dp: int = 1, recipe: str | bool = "megatron") -> dict[str, float]:
    """Model states per parameter, mixed precision with AdamW: a bf16 param (2), an fp32 main
    gradient (4), an fp32 master param and two Adam moments (12). `megatron` (Megatron-LM):
    18 bytes; `distributed_optimizer` (Megatron-LM's, `--use-distributed-optimizer`): the 12
    optimizer bytes over the `dp` data-parallel ranks, 6 + 12/d; `fsdp2` (torchtitan's FSDP2
    with bf16 gathers): all of it sharded, (2 + 4 + 12)/d. (`True` / `False` stand for
    the distributed optimizer or not, as earlier callers said it.)"""
    if isinstance(recipe, bool):
        recipe = "distributed_optimizer" if recipe else "megatron"
    if recipe not in STATE_RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; recipes: {', '.join(STATE_RECIPES)}")
    if recipe == "fsdp2":
        return {"parameters": 2 / dp, "gradients": 4 / dp, "optimizer_state": 12 / dp}
    state = 12 / dp if recipe == "distributed_optimizer" else 12.0
    return {"parameters": 2.0, "gradients": 4.0, "optimizer_state": state}


def step_comm_bytes(
    layer: Layer,
    layers: int,
    vocab: int,
    dp: int,
    sequence_parallel: bool,
    recompute: str = "none",
) -> dict[str, float]:
    """Bytes one rank moves in a training step of a Llama-style model under Megatron-LM's
    recipe, by mesh axis: `tp` (the layers' collectives, plus the vocab-parallel embedding
    and head: the embedding's partial sums reduced (or reduce-scattered), the final norm's
    output gathered for the head and its gradient reduced, gathered again for the head's
    weight gradient with sequence parallelism, and the vocab-parallel cross entropy's max
    and sum statistics, float32, twice each way) and `dp` (the float32 main gradients of
    this rank's parameters all-reduced: 2(d-1)/d of 4 bytes each).
    """
    t, ring = layer.t, (layer.t - 1) / layer.t
    act = HALF * layer.sbh
    tp = layers * sum(
        size for _, size in layer_collectives(layer, sequence_parallel, recompute).values()
    )
    if t > 1:
        if sequence_parallel:  # embed: RS fwd, AG bwd; final norm: AG fwd, RS bwd, AG again
            tp += 5 * ring * act
        else:  # embed: AR fwd; final norm gradient: AR bwd
            tp += 2 * 2 * ring * act
        stats = 4 * layer.s * layer.b  # float32 [s, b]
        tp += 4 * 2 * ring * stats
    h, kv, f = layer.h, layer.h * layer.g // layer.a, layer.f
    sharded = 2 * h * h + 2 * h * kv + 3 * h * f
    per_layer = (
        sharded / t + 2 * h
        if not layer.kv_replicated
        else ((2 * h * h + 3 * h * f) / t + 2 * h * kv + 2 * h)
    )
    params = layers * per_layer + 2 * vocab * h / t + h
    grads = 2 * (dp - 1) / dp * 4 * params if dp > 1 else 0.0
    return {"tp": tp, "dp": grads}
