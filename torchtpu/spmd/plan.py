"""The `tp_plan` option: which parameters are split over the mesh's "tp" axis, and how.

A plan maps module-name patterns to a style, the way Hugging Face models declare theirs
(`config.base_model_tp_plan`, the model class's `_tp_plan`). A pattern matches a module whose
dotted name ends with it, `*` standing for one name component (`layers.*.mlp.up_proj`); the
longest matching pattern wins. The styles say how a module's weights are split:

| style | Linear weight [out, in] | Linear bias | Embedding weight [rows, dim] |
|---|---|---|---|
| colwise | out over tp | over tp | dim over tp |
| rowwise | in over tp | replicated | rows over tp |
| replicate, sequence | replicated | replicated | replicated |

XLA's partitioner then inserts whatever communication the shardings need, so a plan changes
speed and memory, never results. "sequence" (HF's sequence parallelism of norms) keeps the
weights replicated; how activations are split is left to XLA's sharding propagation.
"""
from __future__ import annotations

import re

import torch
from jax.sharding import PartitionSpec as P

from torchtpu.options import STYLES, parse_plan  # noqa: F401  (the option's styles, and its parser)

# Hugging Face's style names (transformers' tensor-parallel layer classes) -> ours. Their
# variants differ in what they do with activations (gather, local views, packed weights),
# which XLA's partitioner decides here.
_HF_STYLES = {
    "colwise": "colwise", "colwise_rep": "colwise", "colwise_gather_output": "colwise",
    "local_colwise": "colwise", "packed_colwise": "colwise",
    "rowwise": "rowwise", "rowwise_rep": "rowwise", "local_rowwise": "rowwise",
    "packed_rowwise": "rowwise", "embedding_rowwise": "rowwise", "local_packed_rowwise": "rowwise",
    "sequence_parallel": "sequence", "sequence": "sequence",
    "replicate": "replicate", "replicated_with_grad_allreduce": "replicate", "gather": "replicate",
    "local": "replicate", "isolated": "replicate", "ep_router": "replicate", "grouped_gemm": "replicate",
}


def auto_plan(model) -> dict[str, str]:
    """The plan a Hugging Face model declares: its config's `base_model_tp_plan` (module names
    under the base model, prefixed with `base_model_prefix` when `model` wraps one) and the
    class's own `_tp_plan` (e.g. the language-model head).

    Raises:
        ValueError: the model declares no plan.
    """
    plan: dict[str, str] = {}
    config = getattr(model, "config", None)
    base = dict(getattr(config, "base_model_tp_plan", None) or {})
    prefix = getattr(model, "base_model_prefix", "")
    wrapped = bool(prefix) and isinstance(getattr(model, prefix, None), torch.nn.Module)
    for pattern, style in base.items():
        plan[f"{prefix}.{pattern}" if wrapped else pattern] = style
    plan.update(getattr(type(model), "_tp_plan", None) or {})
    if not plan:
        raise ValueError(f"torchtpu: tp_plan='auto' but {type(model).__name__} declares no tensor-parallel "
                         "plan (config.base_model_tp_plan / _tp_plan); pass tp_plan={pattern: style}")
    return {pattern: _our_style(pattern, style) for pattern, style in plan.items()}


def _our_style(pattern: str, style: str) -> str:
    ours = _HF_STYLES.get(style)
    if ours is None:
        raise ValueError(f"torchtpu: tp_plan[{pattern!r}]={style!r} is a style we do not know; "
                         f"known: {sorted(_HF_STYLES)}")
    return ours


def style_for(module_name: str, plan: dict[str, str]) -> tuple[str, str] | None:
    """(pattern, style) of the longest pattern matching `module_name`, or None."""
    best = None
    for pattern, style in plan.items():
        if _matches(pattern, module_name) and (best is None or len(pattern) > len(best[0])):
            best = (pattern, style)
    return best


def _matches(pattern: str, name: str) -> bool:
    regex = r"(?:.*\.)?" + r"[^.]+".join(re.escape(p) for p in pattern.split("*")) + r"\Z"
    return re.match(regex, name) is not None


def partition_spec(style: str, param: str, shape: tuple[int, ...], embedding: bool, tp: int) -> tuple[P, str]:
    """The PartitionSpec of one parameter under `style`, and why (for the event record).

    Args:
        style: one of STYLES.
        param: the parameter's own name in its module ("weight", "bias").
        shape: its shape.
        embedding: whether the module is an embedding (its weight is [rows, dim]).
        tp: the size of the mesh's tp axis.
    """
    dim = _split_dim(style, param, len(shape), embedding)
    if dim is None:
        return P(), style
    if shape[dim] % tp:
        return P(), f"{style}: dim {dim} of size {shape[dim]} does not split {tp} ways, replicated"
    return P(*[("tp" if d == dim else None) for d in range(len(shape))]), style


def _split_dim(style: str, param: str, ndim: int, embedding: bool) -> int | None:
    if style in ("replicate", "sequence") or ndim == 0:
        return None
    if ndim == 1:  # a bias follows the output features: split with colwise, whole with rowwise
        return 0 if style == "colwise" and param == "bias" else None
    if embedding:
        return 1 if style == "colwise" else 0
    return 0 if style == "colwise" else 1

