"""Random ops. Keys come from torch's default generator at each call (torch.manual_seed
makes runs repeatable); the streams differ from eager torch's, so tests compare
distributions, shapes and dtypes, not values."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torchtpu.compiler.registry import op
from torchtpu.compiler.rules.reduction import accumulate_dtype

aten = torch.ops.aten


def _float(ctx):
    return accumulate_dtype(ctx.out_dtype)


@op(aten.rand.default, random=True)
def _rand(ctx, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.uniform(ctx.next_key(), tuple(size), _float(ctx))


@op(aten.randn.default, random=True)
def _randn(ctx, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.normal(ctx.next_key(), tuple(size), _float(ctx))


@op(aten.rand_like.default, random=True)
def _rand_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jax.random.uniform(ctx.next_key(), x.shape, _float(ctx))


@op(aten.randn_like.default, random=True)
def _randn_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jax.random.normal(ctx.next_key(), x.shape, _float(ctx))


@op(aten.randint.low, random=True)
def _randint_low(ctx, low, high, size, *, generator=None, dtype=None, layout=None, device=None,
                 pin_memory=None):
    return jax.random.randint(ctx.next_key(), tuple(size), low, high, jnp.int64)


@op(aten.randint.default, random=True)
def _randint(ctx, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.randint(ctx.next_key(), tuple(size), 0, high, jnp.int64)


@op(aten.randperm.default, random=True)
def _randperm(ctx, n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.permutation(ctx.next_key(), n).astype(ctx.out_dtype)


@op(aten.bernoulli.p, random=True)
def _bernoulli_p(ctx, x, p=0.5, *, generator=None):
    return jax.random.bernoulli(ctx.next_key(), p, x.shape)


@op(aten.bernoulli.default, random=True)
def _bernoulli(ctx, x, *, generator=None):
    return jax.random.uniform(ctx.next_key(), x.shape, accumulate_dtype(x.dtype)) < x


@op(aten.native_dropout.default, random=True)
def _native_dropout(ctx, x, p, train):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(ctx.next_key(), 1.0 - p, x.shape)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype)), keep


@op(aten.uniform.default, random=True)
def _uniform(ctx, x, low=0.0, high=1.0, *, generator=None):
    return jax.random.uniform(ctx.next_key(), x.shape, accumulate_dtype(x.dtype), low, high)


@op(aten.normal.Tensor_Tensor, random=True)
def _normal_tt(ctx, mean, std, *, generator=None):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    return mean + std * jax.random.normal(ctx.next_key(), shape, _float(ctx))


@op(aten.normal_functional.default, random=True)
def _normal_functional(ctx, x, mean=0.0, std=1.0, *, generator=None):
    return mean + std * jax.random.normal(ctx.next_key(), x.shape, accumulate_dtype(x.dtype))


@op(aten.exponential.default, random=True)
def _exponential(ctx, x, lambd=1.0, *, generator=None):
    return jax.random.exponential(ctx.next_key(), x.shape, accumulate_dtype(x.dtype)) / lambd


@op(aten.cauchy.default, random=True)
def _cauchy(ctx, x, median=0.0, sigma=1.0, *, generator=None):
    return median + sigma * jax.random.cauchy(ctx.next_key(), x.shape, accumulate_dtype(x.dtype))


@op(aten.log_normal.default, random=True)
def _log_normal(ctx, x, mean=1.0, std=2.0, *, generator=None):
    return jnp.exp(mean + std * jax.random.normal(ctx.next_key(), x.shape, accumulate_dtype(x.dtype)))


@op(aten.geometric.default, random=True)
def _geometric(ctx, x, p, *, generator=None):
    # torch's support is {1, 2, ...}: the number of trials up to the first success
    u = jax.random.uniform(ctx.next_key(), x.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-jnp.float32(p)))


@op(aten.bernoulli.Tensor, random=True)
def _bernoulli_tensor(ctx, x, p, *, generator=None):
    u = jax.random.uniform(ctx.next_key(), x.shape, accumulate_dtype(p.dtype))
    return u < jnp.broadcast_to(p, x.shape)


@op(aten.poisson.default, random=True)
def _poisson(ctx, rates, generator=None):
    return jax.random.poisson(ctx.next_key(), rates.astype(jnp.float32), rates.shape)


@op(aten.multinomial.default, random=True)
def _multinomial(ctx, probs, num_samples, replacement=False, *, generator=None):
    logits = jnp.log(probs.astype(accumulate_dtype(probs.dtype)))
    key = ctx.next_key()
    if replacement:
        draws = jax.random.categorical(key, logits, shape=(num_samples, *logits.shape[:-1]))
        return jnp.moveaxis(draws, 0, -1)
    # without replacement: the top num_samples of the logits perturbed by Gumbel noise
    return jax.lax.top_k(logits + jax.random.gumbel(key, logits.shape, logits.dtype), num_samples)[1]
