"""One ATen call on tpu tensors, as a program signature and the values that feed it.

`describe(op, args, kwargs)` puts the arguments in schema order and replaces
  - each tpu tensor by a Tensor marker: which distinct storage it views (storages passed once
    even when several arguments view them), its dtype, size, stride and offset;
  - each runtime scalar by a Scalar marker: an int or float where the schema takes a Tensor
    (torch's wrapped numbers: `x * 0.9`, `t / bias_correction`), a float in a Scalar argument
    named in LIFTED (`alpha`, `value`: learning rates, step sizes), a 0-d CPU tensor;
and keeps every other argument (sizes, dims, dtypes, flags, bools, other Scalars) as a constant
of the program. The key is the op, the storages' (shape, dtype) and that template: two calls
with equal keys run the same program.

CPU index tensors (`x[cpu_index]`) are uploaded, as torch accepts them for device tensors;
any other CPU tensor with dimensions is torch's mixed-device error.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys

import torch

from torchtpu.device import storage as storages

# Scalar (not Tensor) arguments that hold a per-step value; other Scalars are constants.
LIFTED = frozenset({"alpha", "value", "scalar", "scalars"})  # the last two: _foreach_* ops only


class Marker:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


TENSOR, SCALAR = Marker("Tensor"), Marker("Scalar")
DEVICE = Marker("device")


@dataclasses.dataclass(frozen=True)
class ArgInfo:
    name: str
    kind: str  # "tensor" (Tensor or Tensor?), "tensors" (a list of them), "scalar" (Scalar),
    #            "scalars" (Scalar[]), "other"
    kwarg_only: bool
    default: object
    writes: bool  # the op writes it (in-place self, out=)
    is_out: bool


@dataclasses.dataclass(frozen=True)
class Schema:
    args: tuple[ArgInfo, ...]
    returns_alias: tuple  # per return: the position of the argument it aliases, or None
    returns_view: bool  # some return aliases an argument the op does not write (a view op)
    tensor_returns: bool  # every return is a Tensor, Tensor? or Tensor[]
    # per argument, for native.cc's describe: its kind's code (| 8 when LIFTED), name, default
    codes: tuple = ()
    names: tuple = ()
    defaults: tuple = ()


def kind_of(t) -> str:
    """An argument type's kind: tensor, tensors, scalar or other."""
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch._C.TensorType):
        return "tensor"
    if isinstance(t, torch._C.ListType) and isinstance(_unwrap(t.getElementType()), torch._C.TensorType):
        return "tensors"
    if isinstance(t, torch._C.NumberType):
        return "scalar"
    if isinstance(t, torch._C.ListType) and isinstance(t.getElementType(), torch._C.NumberType):
        return "scalars"
    return "other"


def _unwrap(t):
    return t.getElementType() if isinstance(t, torch._C.OptionalType) else t


_SCHEMAS: dict[int, Schema] = {}  # by id(op): OpOverload hashes in Python, and overloads live forever


def schema_of(op: torch._ops.OpOverload) -> Schema:
    schema = _SCHEMAS.get(id(op))
    if schema is None:
        schema = _SCHEMAS[id(op)] = _schema(op)
    return schema


def _schema(op: torch._ops.OpOverload) -> Schema:
    s = op._schema
    args = tuple(ArgInfo(a.name, kind_of(a.type), a.kwarg_only, a.default_value if a.has_default_value() else None,
                         bool(a.alias_info and a.alias_info.is_write), a.is_out) for a in s.arguments)
    sets = [a.alias_info.before_set if a.alias_info else None for a in s.arguments]
    aliases, view = [], False
    for r in s.returns:
        if r.alias_info is None:
            aliases.append(None)
            continue
        position = next((i for i, b in enumerate(sets) if b and b == r.alias_info.before_set), None)
        aliases.append(position)
        view = view or not r.alias_info.is_write
    tensor_returns = all(kind_of(r.type) in ("tensor", "tensors") for r in s.returns)
    codes = tuple(_KIND_CODES[a.kind] | (8 if a.name in LIFTED else 0) for a in args)
    return Schema(args, tuple(aliases), view, tensor_returns, codes, tuple(a.name for a in args),
                  tuple(a.default for a in args))


_KIND_CODES = {"other": 0, "tensor": 1, "tensors": 2, "scalar": 3, "scalars": 4}


class OpCall:
    """Attributes:
        op: the overload.
        values: the arguments in schema order, as given.
        template: `values` with tpu tensors and runtime scalars replaced by markers
            (TENSOR, storage index, dtype, size, stride, offset) / (SCALAR, index, dtype, how),
            `how` being "number" (a Python number: graph.py traces it with sentinel values and
            finds where it lands) or "host" (a 0-d CPU tensor, an input of the trace as is).
        storages: the distinct DeviceStorages the tensors view, in first-use order.
        scalars: the runtime scalars' values (Python numbers or 0-d CPU tensors).
        key: what the program depends on.
        padded: some storage holds a padded array (device/bucketed.py).
    """

    __slots__ = ("op", "values", "template", "storages", "scalars", "key", "padded")

    def __init__(self, op, values: list, template: tuple, storages: list, scalars: list, key: tuple,
                 padded: bool = False):
        self.op, self.values, self.template, self.storages, self.scalars, self.key, self.padded = (
            op, values, template, storages, scalars, key, padded)

    def with_template(self, template: tuple) -> "OpCall":
        return OpCall(self.op, self.values, template, self.storages, self.scalars, self.key, self.padded)


class MixedDevices(RuntimeError):
    pass


def describe(op, args, kwargs, lift: bool = True) -> OpCall:
    """The OpCall of `op(*args, **kwargs)`. `lift=False` keeps every Python number a constant
    (for a program whose lowering needs the value itself)."""
    schema = schema_of(op)
    fast = _fast_describe
    if fast is not None:  # the common case in C++ (device/native.cc), else the same below
        parts = fast(schema.codes, schema.names, schema.defaults, id(op), args, kwargs, lift,
                     torch.get_default_dtype())
        if parts is not None:
            return OpCall(op, *parts)
    specs = schema.args
    n = len(args)
    if kwargs:
        values = [args[i] if i < n else kwargs.get(a.name, a.default) for i, a in enumerate(specs)]
    else:
        values = list(args)
        if n < len(specs):
            values += [a.default for a in specs[n:]]
    state = _State(lift)
    tensor, encode = state.tensor, state.encode  # most arguments are tensors: straight to their marker
    template = tuple([tensor(v, a) if isinstance(v, torch.Tensor) else encode(v, a) for v, a in zip(values, specs)])
    if state.f64:  # a float64 computation takes its runtime floats at full precision
        template = _widen(template)
    key = (id(op), tuple([(s.shape, s.dtype) for s in state.storages]), template, torch.get_default_dtype())
    return OpCall(op, values, template, state.storages, state.scalars, key, state.padded)


_F64 = torch.float64


class _State:
    __slots__ = ("lift", "storages", "index", "scalars", "f64", "padded")

    def __init__(self, lift: bool):
        self.lift = lift
        self.storages: list = []
        self.index: dict[int, int] = {}
        self.scalars: list = []
        self.f64 = False
        self.padded = False

    def encode(self, v, arg: ArgInfo):
        if isinstance(v, torch.Tensor):
            return self.tensor(v, arg)
        if isinstance(v, (list, tuple)):
            return tuple([self.encode(x, arg) for x in v])
        cls = v.__class__
        if self.lift and (cls is float or cls is int) and (
                arg.kind == "tensor" or (arg.kind in ("scalar", "scalars") and arg.name in LIFTED and cls is float)):
            self.scalars.append(v)
            dtype = torch.get_default_dtype() if cls is float else torch.int64
            return (SCALAR, len(self.scalars) - 1, dtype, "number")
        if cls is float and (v != v or v == 0):  # NaN is not equal to itself; -0.0 equals 0.0
            return (cls, math.nan) if v != v else (cls, v, math.copysign(1.0, v))
        if cls in (int, float, bool, complex):
            return (cls, v)  # 1, 1.0 and True are different programs
        if cls is torch.device:
            return DEVICE
        if isinstance(v, torch.Generator):
            raise NotImplementedError("torchtpu.device: a torch.Generator argument is not supported yet")
        return v

    def tensor(self, t: torch.Tensor, arg: ArgInfo):
        fast = _fast_marker
        if fast is not None:  # the common case in C++ (device/native.cc), else the same below
            marker = fast(t, self.index, self.storages)
            if marker is not None:
                return marker
        s = getattr(t.untyped_storage(), "_tpu", None)
        if s is None:
            device = t.device
            if device.type == "cpu" and t.dim() == 0:  # torch accepts 0-d CPU tensors with any device
                self.scalars.append(t)
                return (SCALAR, len(self.scalars) - 1, t.dtype, "host")
            if device.type == "cpu" and arg.name == "indices":
                t = t.to(storages.device_name())
                s = storages.storage_of(t)
            else:
                raise MixedDevices(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, {storages.device_name()}:0 and {device}!")
        dtype = t.dtype
        if dtype is not s.dtype:  # a view of another dtype: the storage's bytes, read as it
            s.retype(dtype)
        i = self.index.get(id(s))
        if i is None:
            i = self.index[id(s)] = len(self.storages)
            self.storages.append(s)
            if s.padding is not None:
                self.padded = True
        if dtype is _F64:
            self.f64 = True
        return (TENSOR, i, dtype, t.shape, t.stride(), t.storage_offset())


def _widen(template):
    if isinstance(template, tuple) and template and template[0] is SCALAR:
        if template[3] == "number" and template[2] == torch.float32:
            return (SCALAR, template[1], torch.float64, "number")
        return template
    if isinstance(template, tuple):
        return tuple(_widen(x) for x in template)
    return template


_INTERNAL = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
_internal_code: dict = {}


def _python_user_frame() -> tuple:
    """(filename, line, function) of the innermost frame outside torch and torchtpu: the user's
    line that called the op."""
    f = sys._getframe(1)
    last = None
    while f is not None:
        code = f.f_code
        internal = _internal_code.get(code)
        if internal is None:
            internal = _internal_code[code] = code.co_filename.startswith(_INTERNAL)
        if not internal:
            return code.co_filename, f.f_lineno, code.co_name
        last = f
        f = f.f_back
    code = last.f_code if last is not None else None
    return (code.co_filename, last.f_lineno, code.co_name) if code else ("?", 0, "?")


user_frame = _python_user_frame  # callers look it up here (call.user_frame): native.cc's once loaded
_fast_marker = None  # native.cc's tensor_marker once loaded
_fast_describe = None  # native.cc's describe once loaded


def use_native(extension) -> None:
    """The C++ twins of describe's and _State.tensor's common case and of user_frame (device/native.py)."""
    global _fast_marker, _fast_describe, user_frame
    extension.set_marker_types(TENSOR, torch.Size)
    extension.set_describe_types(SCALAR, DEVICE, "number", torch.int64, math.nan, torch.device, torch.Generator)
    _fast_marker, _fast_describe = extension.tensor_marker, extension.describe
    native_user_frame = extension.user_frame
    user_frame = functools.partial(native_user_frame, _INTERNAL, _internal_code)  # no frame of its own
