// The eager tpu device's C++ registrations (device/native.py builds and loads this file).
//
// torch.nn.functional.scaled_dot_product_attention asks a per-device stub which kernel to use;
// a Python backend cannot answer it, so tpu tensors took the math path: ~13 ops and ~20 views
// per call forward, ~11 ops backward, each its own program (strict) or step (defer). Here the
// stub answers "overrideable" where the device's fused kernel (device/attention.py: one
// program, forward or backward) computes what the math path would, and "math" elsewhere:
// dropout, a mask that needs a gradient, key/value heads that differ without enable_gqa, or
// tensors a tracer holds (FakeTensor, functionalization: torch.compile keeps the graph it had).
//
// The device guard and the metadata-only view kernels are here too: torch calls the guard
// several times per autograd node (a Python guard takes the GIL and calls Python each time: 30
// calls for one 8x8 matmul's forward and backward), and a Python view kernel is a round trip
// into Python per view (~130 a training step); both do only what the Python versions did.
// Waiting on the device (torch.accelerator.synchronize, Stream and Event synchronize) calls
// back into torch.tpu.synchronize, which native.py registers at load.
//
// The library is also a CPython module (torchtpu.device._native) of functions on every op's
// path (and the set_* functions, their setup), each doing what its Python twin does (which
// stays where the library is off):
//   make_tensor    the body of storage.wrap: a tpu tensor over a torch storage, with size,
//                  stride and offset (Python: an empty tensor and a redispatched set_, ~2.3 us
//                  for every result of every op; here ~0.6 us, the same tensor and bound check)
//   tensor_marker  call.py's marker of a tpu tensor argument, for the common case (its storage's
//                  dtype, not float64, not padded); anything else returns None to Python's path
//   user_frame     call.py's innermost frame outside torch and torchtpu (defer mode, per op)
//   describe       call.describe's body for the common case (every tensor argument takes the
//                  marker above, no Generator): the values in schema order, the template, the
//                  storages, the runtime scalars and the key, built as Python builds them; None
//                  sends the call to Python's path (which then decides everything)
//   torch_storage  storage.torch_storage: the torch storage of a DeviceStorage
//   account, release  storage's byte and address counters, as atomics (Python's take a lock)
//   record         defer.Defer.run's record of a known op: its inputs wired to the pending
//                  graph, the trie step, the Pending results and their tensors
//   run_kernel, run_known  torch's call of a device kernel (and the fallback's) straight to
//                  describe and record in defer mode, for an op whose key is known and whose
//                  returns are plain; anything else is the Python kernel's call
#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>

namespace {

bool traced(const at::Tensor& t) {
  const auto keys = t.key_set();
  return keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize);
}

int64_t choose(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
               double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa) {
  const auto math = static_cast<int64_t>(sdp::SDPBackend::math);
  if (traced(q) || traced(k) || traced(v) || (mask.has_value() && mask->defined() && traced(*mask))) return math;
  if (dropout_p != 0.0 || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return math;
  if (q.is_nested() || k.is_nested() || v.is_nested()) return math;
  if (!at::isFloatingType(q.scalar_type()) || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type()) return math;
  if (q.size(-1) != k.size(-1) || k.size(2) != v.size(2) || k.size(1) != v.size(1)) return math;
  if (k.size(1) != q.size(1) && (!enable_gqa || k.size(1) == 0 || q.size(1) % k.size(1) != 0)) return math;
  if (mask.has_value() && mask->defined()) {
    if (mask->requires_grad()) return math;
    if (mask->scalar_type() != at::kBool && mask->scalar_type() != q.scalar_type()) return math;
  }
  return static_cast<int64_t>(sdp::SDPBackend::overrideable);
}

}  // namespace

namespace at {
namespace native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &choose);
}  // namespace native
}  // namespace at

namespace {

// torch.tpu.synchronize, as native.py registers it: 0, or nonzero with the Python error's
// message written into `message` (at most `size` bytes, zero-terminated).
using Synchronize = int (*)(char* message, size_t size);
std::atomic<Synchronize> synchronize_callback{nullptr};

void synchronize() {
  const Synchronize fn = synchronize_callback.load();
  if (fn == nullptr) return;  // nothing registered: nothing ran on the device
  char message[4096] = {0};
  TORCH_CHECK(fn(message, sizeof(message)) == 0, message);
}

// One device, tpu:0; one stream, whose programs order themselves, so waiting on the stream, an
// event or the device is torch.tpu.synchronize: what torch's guard for a Python backend does
// (which had no synchronize at all), without calling into Python for the device type.
struct Guard final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  static c10::Device device() { return c10::Device(kType, 0); }
  static c10::Stream stream() { return c10::Stream(c10::Stream::DEFAULT, device()); }

  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return device(); }
  c10::Device getDevice() const override { return device(); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override { return stream(); }
  c10::Stream getNewStream(c10::Device, int) const override { return stream(); }
  c10::Stream exchangeStream(c10::Stream) const noexcept override { return stream(); }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override { synchronize(); }
  void synchronizeEvent(void*) const override { synchronize(); }
  void synchronizeDevice(const c10::DeviceIndex) const override { synchronize(); }
};

// A view op on tpu tensors: torch's CPU kernel, which only computes size, stride and offset
// over the same storage (device/kernels.py lists the ops: VIEWS).
void cpu_view(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

}  // namespace

extern "C" void torchtpu_set_synchronize(Synchronize fn) { synchronize_callback.store(fn); }

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);  // replaces the Python backend's guard

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"as_strided", "view", "_reshape_alias", "unfold", "view_as_real", "view_as_complex"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&cpu_view>());
  }
}

namespace {

std::vector<int64_t> ints(PyObject* sequence, const char* what) {
  PyObject* fast = PySequence_Fast(sequence, what);
  if (fast == nullptr) throw python_error();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  std::vector<int64_t> out(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      throw python_error();
    }
  }
  Py_DECREF(fast);
  return out;
}

// make_tensor(storage: torch.UntypedStorage, size, stride, offset: int, dtype) -> torch.Tensor
PyObject* make_tensor(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 5, "make_tensor(storage, size, stride, offset, dtype): ", nargs, " arguments");
  TORCH_CHECK(THPStorage_Check(args[0]) && THPDtype_Check(args[4]), "make_tensor(storage, size, stride, offset, dtype)");
  c10::Storage storage = THPStorage_Unpack(args[0]);
  const auto size = ints(args[1], "make_tensor: size is a sequence of ints");
  const auto stride = ints(args[2], "make_tensor: stride is a sequence of ints");
  const int64_t offset = PyLong_AsLongLong(args[3]);
  if (offset == -1 && PyErr_Occurred()) throw python_error();
  const auto dtype = reinterpret_cast<THPDtype*>(args[4])->scalar_type;
  TORCH_CHECK(size.size() == stride.size(), "make_tensor: ", size.size(), " sizes and ", stride.size(), " strides");
  TORCH_CHECK(offset >= 0, "make_tensor: negative storage offset ", offset);
  int64_t last = offset;  // the last element it spans (torch's set_ checks the same bound)
  bool empty = false;
  for (size_t i = 0; i < size.size(); ++i) {
    TORCH_CHECK(size[i] >= 0 && stride[i] >= 0, "make_tensor: negative size or stride");
    empty = empty || size[i] == 0;
    last += (size[i] - 1) * stride[i];
  }
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(dtype));
  TORCH_CHECK(empty || (last + 1) * itemsize <= static_cast<int64_t>(storage.nbytes()), "make_tensor: size ", size,
              ", stride ", stride, " and offset ", offset, " are out of bounds for a storage of ", storage.nbytes(),
              " bytes");
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
  return THPVariable_Wrap(std::move(t));
  END_HANDLE_TH_ERRORS
}

// Interned attribute names, made once (a set_* function may run again: the first ones stay).
void intern(std::initializer_list<std::pair<PyObject**, const char*>> names) {
  for (const auto& [target, text] : names) {
    if (*target == nullptr) *target = PyUnicode_InternFromString(text);
    if (*target == nullptr) throw python_error();
  }
}

// Set once (call.use_native, at load): call.TENSOR, torch.Size, and the interned attribute names.
PyObject* tensor_tag = nullptr;
PyTypeObject* size_type = nullptr;
PyObject* tpu_name = nullptr;
PyObject* dtype_name = nullptr;
PyObject* padding_name = nullptr;

PyObject* set_marker_types(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 2 && PyType_Check(args[1]), "set_marker_types(TENSOR, torch.Size)");
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  tensor_tag = args[0];
  size_type = reinterpret_cast<PyTypeObject*>(args[1]);
  intern({{&tpu_name, "_tpu"}, {&dtype_name, "dtype"}, {&padding_name, "padding"}});
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

THPObjectPtr int_tuple(PyTypeObject* type, c10::IntArrayRef values) {
  THPObjectPtr out(type->tp_alloc(type, static_cast<Py_ssize_t>(values.size())));
  if (!out) throw python_error();
  for (size_t i = 0; i < values.size(); ++i) {
    PyObject* v = PyLong_FromLongLong(values[i]);
    if (v == nullptr) throw python_error();
    PyTuple_SET_ITEM(out.get(), static_cast<Py_ssize_t>(i), v);
  }
  return out;
}

// tensor_marker(t, index: dict, storages: list) -> (TENSOR, storage index, dtype, size, stride,
// offset), registering t's DeviceStorage in index/storages as call._State.tensor does; or None
// where Python's path decides (not a plain tpu tensor of ours, a dtype view, float64, padded).
PyObject* tensor_marker(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 3 && tensor_tag != nullptr, "tensor_marker(t, index, storages) before set_marker_types");
  if (!THPVariable_CheckExact(args[0])) Py_RETURN_NONE;
  const at::Tensor& t = THPVariable_Unpack(args[0]);
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || !t.has_storage()) Py_RETURN_NONE;
  const auto scalar_type = t.scalar_type();
  if (scalar_type == at::kDouble) Py_RETURN_NONE;
  THPObjectPtr untyped(THPStorage_Wrap(t.storage()));
  if (!untyped) throw python_error();
  THPObjectPtr storage(PyObject_GetAttr(untyped, tpu_name));
  if (!storage) {  // not ours: Python's path raises the right error
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(scalar_type));  // borrowed
  THPObjectPtr storage_dtype(PyObject_GetAttr(storage, dtype_name));
  if (storage_dtype.get() != dtype) {  // a dtype view (Python retypes the storage)
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  THPObjectPtr key(PyLong_FromVoidPtr(storage));  // id(storage)
  if (!key) throw python_error();
  THPObjectPtr position(PyDict_GetItemWithError(args[1], key));  // borrowed: a reference of our own below
  if (position) {
    Py_INCREF(position.get());
  } else {
    if (PyErr_Occurred()) throw python_error();
    THPObjectPtr padding(PyObject_GetAttr(storage, padding_name));
    if (padding.get() != Py_None) {  // padded (or no such attribute): Python's path
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    position = PyLong_FromSsize_t(PyList_GET_SIZE(args[2]));
    if (!position || PyDict_SetItem(args[1], key, position) < 0 || PyList_Append(args[2], storage) < 0) {
      throw python_error();
    }
  }
  THPObjectPtr size = int_tuple(size_type, t.sizes());
  THPObjectPtr stride = int_tuple(&PyTuple_Type, t.strides());
  THPObjectPtr offset(PyLong_FromLongLong(t.storage_offset()));
  if (!offset) throw python_error();
  PyObject* marker = PyTuple_New(6);
  if (marker == nullptr) throw python_error();
  Py_INCREF(tensor_tag);
  Py_INCREF(dtype);
  PyTuple_SET_ITEM(marker, 0, tensor_tag);
  PyTuple_SET_ITEM(marker, 1, position.release());
  PyTuple_SET_ITEM(marker, 2, dtype);
  PyTuple_SET_ITEM(marker, 3, size.release());
  PyTuple_SET_ITEM(marker, 4, stride.release());
  PyTuple_SET_ITEM(marker, 5, offset.release());
  return marker;
  END_HANDLE_TH_ERRORS
}

bool internal_file(PyObject* filename, PyObject* prefixes) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); ++i) {
    const Py_ssize_t match = PyUnicode_Tailmatch(filename, PyTuple_GET_ITEM(prefixes, i), 0, PY_SSIZE_T_MAX, -1);
    if (match < 0) throw python_error();
    if (match) return true;
  }
  return false;
}

PyObject* frame_tuple(PyFrameObject* frame, PyCodeObject* code) {
  return Py_BuildValue("(OiO)", code->co_filename, PyFrame_GetLineNumber(frame), code->co_name);
}

// user_frame(prefixes: tuple[str], cache: dict[code, bool]) -> (filename, line, function) of the
// innermost frame whose file starts with none of the prefixes; else the outermost frame's.
PyObject* user_frame(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 2 && PyTuple_Check(args[0]) && PyDict_Check(args[1]), "user_frame(prefixes, cache)");
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed: the caller's
  Py_XINCREF(frame);
  PyFrameObject* last = nullptr;
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* known = PyDict_GetItemWithError(args[1], reinterpret_cast<PyObject*>(code));
    bool internal;
    if (known != nullptr) {
      internal = known == Py_True;
    } else if (PyErr_Occurred()) {
      internal = true;
      PyErr_Clear();
    } else {
      internal = internal_file(code->co_filename, args[0]);
      PyDict_SetItem(args[1], reinterpret_cast<PyObject*>(code), internal ? Py_True : Py_False);
    }
    if (!internal) {
      PyObject* out = frame_tuple(frame, code);
      Py_DECREF(code);
      Py_DECREF(frame);
      Py_XDECREF(last);
      return out;
    }
    Py_DECREF(code);
    Py_XDECREF(last);
    last = frame;
    frame = PyFrame_GetBack(frame);
  }
  if (last == nullptr) return Py_BuildValue("(sis)", "?", 0, "?");
  PyCodeObject* code = PyFrame_GetCode(last);
  PyObject* out = frame_tuple(last, code);
  Py_DECREF(code);
  Py_DECREF(last);
  return out;
  END_HANDLE_TH_ERRORS
}

// Set once (call.use_native): the markers and types describe builds its template of.
PyObject* scalar_tag = nullptr;   // call.SCALAR
PyObject* device_tag = nullptr;   // call.DEVICE
PyObject* number_how = nullptr;   // "number"
PyObject* int64_dtype = nullptr;  // torch.int64
PyObject* nan_value = nullptr;    // math.nan (the key compares it by identity, as Python's does)
PyTypeObject* device_type = nullptr;     // torch.device
PyTypeObject* generator_type = nullptr;  // torch.Generator
PyObject* shape_name = nullptr;

PyObject* set_describe_types(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 7 && PyType_Check(args[5]) && PyType_Check(args[6]),
              "set_describe_types(SCALAR, DEVICE, 'number', torch.int64, math.nan, torch.device, torch.Generator)");
  for (Py_ssize_t i = 0; i < nargs; ++i) Py_INCREF(args[i]);
  scalar_tag = args[0];
  device_tag = args[1];
  number_how = args[2];
  int64_dtype = args[3];
  nan_value = args[4];
  device_type = reinterpret_cast<PyTypeObject*>(args[5]);
  generator_type = reinterpret_cast<PyTypeObject*>(args[6]);
  shape_name = PyUnicode_InternFromString("shape");
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// An argument's code (call.Schema.codes): its kind, and whether a float in it is lifted (LIFTED).
enum Kind { kOther = 0, kTensor = 1, kTensors = 2, kScalar = 3, kScalars = 4 };
constexpr long kLifted = 8;

struct Describing {
  PyObject* index;     // id(storage) -> position
  PyObject* storages;  // DeviceStorages in first-use order
  PyObject* scalars;   // runtime scalars' values
  PyObject* default_dtype;
  bool lift;
};

PyObject* pair(PyObject* a, PyObject* b) {  // new reference to (a, b); borrows both
  return PyTuple_Pack(2, a, b);
}

// _State.encode/_State.tensor for one value; nullptr with no error set: Python's path decides.
PyObject* encode(PyObject* v, long code, Describing& d) {
  if (THPVariable_Check(v)) {
    PyObject* const args[3] = {v, d.index, d.storages};
    PyObject* marker = tensor_marker(nullptr, args, 3);
    if (marker == Py_None) {
      Py_DECREF(marker);
      return nullptr;
    }
    return marker;  // or nullptr with the error set
  }
  if (PyList_Check(v) || PyTuple_Check(v)) {
    THPObjectPtr fast(PySequence_Fast(v, "describe"));
    if (!fast) return nullptr;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.get());
    THPObjectPtr out(PyTuple_New(n));
    if (!out) return nullptr;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = encode(PySequence_Fast_GET_ITEM(fast.get(), i), code, d);
      if (item == nullptr) return nullptr;
      PyTuple_SET_ITEM(out.get(), i, item);
    }
    return out.release();
  }
  PyTypeObject* cls = Py_TYPE(v);
  const long kind = code & 7;
  const bool is_float = cls == &PyFloat_Type;
  if (d.lift && (is_float || cls == &PyLong_Type) &&
      (kind == kTensor || ((kind == kScalar || kind == kScalars) && (code & kLifted) && is_float))) {
    const Py_ssize_t position = PyList_GET_SIZE(d.scalars);
    if (PyList_Append(d.scalars, v) < 0) return nullptr;
    THPObjectPtr i(PyLong_FromSsize_t(position));
    if (!i) return nullptr;
    return PyTuple_Pack(4, scalar_tag, i.get(), is_float ? d.default_dtype : int64_dtype, number_how);
  }
  PyObject* type = reinterpret_cast<PyObject*>(cls);
  if (is_float) {
    const double x = PyFloat_AS_DOUBLE(v);
    if (x != x) return pair(type, nan_value);
    if (x == 0) {
      THPObjectPtr sign(PyFloat_FromDouble(std::copysign(1.0, x)));
      if (!sign) return nullptr;
      return PyTuple_Pack(3, type, v, sign.get());
    }
    return pair(type, v);
  }
  if (cls == &PyLong_Type || cls == &PyBool_Type || cls == &PyComplex_Type) return pair(type, v);
  if (cls == device_type) {
    Py_INCREF(device_tag);
    return device_tag;
  }
  if (PyObject_TypeCheck(v, generator_type)) return nullptr;  // Python's path raises its error
  Py_INCREF(v);
  return v;
}

// describe(codes, names, defaults, op_id, args, kwargs, lift, default_dtype)
//   -> (values, template, storages, scalars, key), or None for Python's path
PyObject* describe(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 8 && scalar_tag != nullptr && PyTuple_Check(args[0]) && PyTuple_Check(args[4]),
              "describe(codes, names, defaults, op_id, args, kwargs, lift, default_dtype) before set_describe_types");
  PyObject* codes = args[0];
  PyObject* names = args[1];
  PyObject* defaults = args[2];
  PyObject* given = args[4];
  PyObject* kwargs = args[5] == Py_None || PyDict_GET_SIZE(args[5]) == 0 ? nullptr : args[5];
  const Py_ssize_t n = PyTuple_GET_SIZE(codes);
  const Py_ssize_t n_given = PyTuple_GET_SIZE(given);
  if (n_given > n) Py_RETURN_NONE;
  THPObjectPtr values(PyList_New(n));
  THPObjectPtr index(PyDict_New());
  THPObjectPtr storages(PyList_New(0));
  THPObjectPtr scalars(PyList_New(0));
  THPObjectPtr templ(PyTuple_New(n));
  if (!values || !index || !storages || !scalars || !templ) throw python_error();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v;
    if (i < n_given) {
      v = PyTuple_GET_ITEM(given, i);
    } else {
      v = kwargs ? PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(names, i)) : nullptr;
      if (v == nullptr) {
        if (PyErr_Occurred()) throw python_error();
        v = PyTuple_GET_ITEM(defaults, i);
      }
    }
    Py_INCREF(v);
    PyList_SET_ITEM(values.get(), i, v);
  }
  Describing d{index.get(), storages.get(), scalars.get(), args[7], PyObject_IsTrue(args[6]) == 1};
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* marker = encode(PyList_GET_ITEM(values.get(), i), PyLong_AsLong(PyTuple_GET_ITEM(codes, i)), d);
    if (marker == nullptr) {
      if (PyErr_Occurred()) throw python_error();
      Py_RETURN_NONE;
    }
    PyTuple_SET_ITEM(templ.get(), i, marker);
  }
  const Py_ssize_t n_storages = PyList_GET_SIZE(storages.get());
  THPObjectPtr specs(PyTuple_New(n_storages));
  if (!specs) throw python_error();
  for (Py_ssize_t i = 0; i < n_storages; ++i) {
    PyObject* s = PyList_GET_ITEM(storages.get(), i);
    THPObjectPtr shape(PyObject_GetAttr(s, shape_name));
    THPObjectPtr dtype(PyObject_GetAttr(s, dtype_name));
    if (!shape || !dtype) throw python_error();
    PyObject* spec = pair(shape.get(), dtype.get());
    if (spec == nullptr) throw python_error();
    PyTuple_SET_ITEM(specs.get(), i, spec);
  }
  THPObjectPtr key(PyTuple_Pack(4, args[3], specs.get(), templ.get(), args[7]));
  if (!key) throw python_error();
  PyObject* out = PyTuple_Pack(5, values.get(), templ.get(), storages.get(), scalars.get(), key.get());
  if (out == nullptr) throw python_error();
  return out;
  END_HANDLE_TH_ERRORS
}

PyObject* torch_storage(PyObject*, PyObject* storage);  // below

// --- defer mode's record of a known op (defer.Defer.run's hit path) -----------------------------

// Set once (defer.use_native): the classes and functions record builds with and calls back.
struct RecordTypes {
  PyObject* pending = nullptr;        // storage.Pending
  PyObject* record = nullptr;         // defer.Record (a NamedTuple)
  PyObject* storage = nullptr;        // storage.DeviceStorage
  PyObject* graph_task = nullptr;     // torch._C._current_graph_task_id
  PyObject* drop_inputs = nullptr;    // defer._drop_inputs
  PyObject* frame_prefixes = nullptr; // call._INTERNAL
  PyObject* frame_cache = nullptr;    // call._internal_code
  PyObject* declined = nullptr;       // what record returns where Python's path must run instead
  PyObject* scalar_arrays = nullptr;  // transfer._scalars: (dtype, value, sign) -> a 0-d device array
} types;

struct Names {
  PyObject *array, *graph, *index, *shape, *records, *limit, *hits, *inputs, *specs, *input_of, *node, *children,
      *values, *random, *ref, *child, *after_backward, *set, *scalar_input, *backward_task, *number;
} names;

PyObject* set_record_types(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 9 && PyDict_Check(args[8]), "set_record_types(Pending, Record, DeviceStorage, graph_task, "
              "drop_inputs, prefixes, cache, declined, scalar_arrays)");
  PyObject** slots[] = {&types.pending,     &types.record,         &types.storage,     &types.graph_task,
                        &types.drop_inputs, &types.frame_prefixes, &types.frame_cache, &types.declined,
                        &types.scalar_arrays};
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_INCREF(args[i]);
    Py_XSETREF(*slots[i], args[i]);
  }
  intern({{&names.array, "array"}, {&names.graph, "graph"}, {&names.index, "index"}, {&names.shape, "shape"},
          {&names.records, "records"}, {&names.limit, "limit"}, {&names.hits, "hits"}, {&names.inputs, "inputs"},
          {&names.specs, "specs"}, {&names.input_of, "input_of"}, {&names.node, "node"},
          {&names.children, "children"}, {&names.values, "values"}, {&names.random, "random"},
          {&names.ref, "_ref"}, {&names.child, "_child"}, {&names.after_backward, "_flush_after_backward"},
          {&names.set, "set"}, {&names.scalar_input, "_scalar_input"}, {&names.backward_task, "backward_task"},
          {&names.number, "number"}});
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

THPObjectPtr attr(PyObject* o, PyObject* name) {
  THPObjectPtr out(PyObject_GetAttr(o, name));
  if (!out) throw python_error();
  return out;
}

void set_attr(PyObject* o, PyObject* name, PyObject* value) {
  if (PyObject_SetAttr(o, name, value) < 0) throw python_error();
}

THPObjectPtr call(PyObject* fn, std::initializer_list<PyObject*> args) {
  THPObjectPtr out(PyObject_Vectorcall(fn, const_cast<PyObject**>(args.begin()), args.size(), nullptr));
  if (!out) throw python_error();
  return out;
}

THPObjectPtr call_method(PyObject* self, PyObject* name, std::initializer_list<PyObject*> args) {
  std::vector<PyObject*> all{self};
  all.insert(all.end(), args.begin(), args.end());
  THPObjectPtr out(PyObject_VectorcallMethod(name, all.data(), all.size() | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  if (!out) throw python_error();
  return out;
}

// The input index of `storage` in `graph` (Defer._ref): a value of this graph is ~its index; a
// plain array is a graph input, once per array; anything else is Python's _ref.
THPObjectPtr input_ref(PyObject* executor, PyObject* graph, PyObject* storage) {
  THPObjectPtr array = attr(storage, names.array);
  if (Py_TYPE(array.get()) == reinterpret_cast<PyTypeObject*>(types.pending)) {
    THPObjectPtr value = attr(array, names.array);
    THPObjectPtr owner = attr(array, names.graph);
    if (value.get() == Py_None && owner.get() == graph) {
      THPObjectPtr index = attr(array, names.index);
      THPObjectPtr out(PyNumber_Invert(index));
      if (!out) throw python_error();
      return out;
    }
    return call_method(executor, names.ref, {graph, storage});
  }
  THPObjectPtr padding = attr(storage, padding_name);
  if (array.get() == Py_None || padding.get() != Py_None) return call_method(executor, names.ref, {graph, storage});
  THPObjectPtr input_of = attr(graph, names.input_of);
  THPObjectPtr key(PyLong_FromVoidPtr(array.get()));  // id(array)
  if (!key) throw python_error();
  PyObject* known = PyDict_GetItemWithError(input_of, key);  // borrowed
  if (known != nullptr) {
    Py_INCREF(known);
    return THPObjectPtr(known);
  }
  if (PyErr_Occurred()) throw python_error();
  THPObjectPtr inputs = attr(graph, names.inputs);
  THPObjectPtr specs = attr(graph, names.specs);
  THPObjectPtr position(PyLong_FromSsize_t(PyList_GET_SIZE(inputs.get())));
  THPObjectPtr shape = attr(storage, names.shape);
  THPObjectPtr dtype = attr(storage, dtype_name);
  THPObjectPtr spec(pair(shape.get(), dtype.get()));
  if (!position || !spec || PyDict_SetItem(input_of, key, position) < 0 || PyList_Append(inputs, array) < 0 ||
      PyList_Append(specs, spec) < 0) {
    throw python_error();
  }
  return position;
}

// A runtime number's input (Defer._scalar_input): its cached 0-d array (transfer.scalar's cache)
// appended as an input of its own; a number not cached yet, or a host tensor, is Python's.
THPObjectPtr scalar_ref(PyObject* executor, PyObject* graph, PyObject* value, PyObject* dtype, PyObject* how) {
  PyObject* array = nullptr;  // borrowed
  const bool is_float = PyFloat_CheckExact(value);
  if ((is_float || PyLong_CheckExact(value)) && PyUnicode_Compare(how, names.number) == 0) {
    THPObjectPtr sign(is_float ? PyFloat_FromDouble(std::copysign(1.0, PyFloat_AS_DOUBLE(value))) : PyLong_FromLong(0));
    THPObjectPtr key(sign ? PyTuple_Pack(3, dtype, value, sign.get()) : nullptr);
    if (!key) throw python_error();
    array = PyDict_GetItemWithError(types.scalar_arrays, key);
    if (array == nullptr && PyErr_Occurred()) throw python_error();
  }
  if (array == nullptr) return call_method(executor, names.scalar_input, {graph, value, dtype, how});
  THPObjectPtr inputs = attr(graph, names.inputs);
  THPObjectPtr specs = attr(graph, names.specs);
  THPObjectPtr position(PyLong_FromSsize_t(PyList_GET_SIZE(inputs.get())));
  THPObjectPtr no_dims(PyTuple_New(0));
  THPObjectPtr spec(no_dims ? pair(no_dims.get(), dtype) : nullptr);
  if (!position || !spec || PyList_Append(inputs, array) < 0 || PyList_Append(specs, spec) < 0) throw python_error();
  return position;
}

// A fresh result: DeviceStorage(numel, dtype, pending) and a tensor over it.
PyObject* fresh_tensor(PyObject* numel, PyObject* size, PyObject* stride, PyObject* dtype, PyObject* pending) {
  THPObjectPtr storage = call(types.storage, {numel, dtype, pending});
  THPObjectPtr untyped(torch_storage(nullptr, storage.get()));
  if (!untyped) throw python_error();
  THPObjectPtr zero(PyLong_FromLong(0));
  if (!zero) throw python_error();
  PyObject* const args[5] = {untyped.get(), size, stride, zero.get(), dtype};
  PyObject* out = make_tensor(nullptr, args, 5);
  if (out == nullptr) throw python_error();
  return out;
}

// What one return of the op is (the form defer.OpEntry.native gives): ("fresh", result, numel,
// size, stride, dtype), ("arg", position) or None.
PyObject* return_value(PyObject* form, PyObject* values, PyObject* results) {
  if (form == Py_None) Py_RETURN_NONE;
  if (PyTuple_GET_SIZE(form) == 2) {
    PyObject* v = PyList_GET_ITEM(values, PyLong_AsSsize_t(PyTuple_GET_ITEM(form, 1)));
    Py_INCREF(v);
    return v;
  }
  PyObject* pending = PyList_GET_ITEM(results, PyLong_AsSsize_t(PyTuple_GET_ITEM(form, 1)));
  return fresh_tensor(PyTuple_GET_ITEM(form, 2), PyTuple_GET_ITEM(form, 3), PyTuple_GET_ITEM(form, 4),
                      PyTuple_GET_ITEM(form, 5), pending);
}

// record(executor, graph, entry, native, storages, values, scalars) -> the op's return value, or
// `declined` (nothing changed: Python's path runs). `native` is the entry's precomputed form
// (OpEntry.native): (id, result shapes, random, mutated ((storage, result) ...), returns (forms
// ...), single, the scalars' ((dtype, how) ...)).
// The caller holds the executor's lock, and has looked the entry up (a hit), as Defer.run does.
PyObject* record(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 7 && types.pending != nullptr, "record(executor, graph, entry, native, storages, values, "
              "scalars) before set_record_types");
  PyObject* executor = args[0];
  PyObject* graph = args[1];
  PyObject* entry = args[2];
  PyObject* native = args[3];
  PyObject* storages = args[4];
  PyObject* values = args[5];
  PyObject* scalars = args[6];
  THPObjectPtr records = attr(graph, names.records);
  THPObjectPtr limit = attr(graph, names.limit);
  if (PyList_GET_SIZE(records.get()) >= PyLong_AsSsize_t(limit)) {  // a flush first: Python's path
    Py_INCREF(types.declined);
    return types.declined;
  }
  {
    THPObjectPtr hits = attr(graph, names.hits);
    THPObjectPtr one(PyLong_FromLong(1));
    THPObjectPtr more(one ? PyNumber_Add(hits, one) : nullptr);
    if (!more) throw python_error();
    set_attr(graph, names.hits, more);
  }
  const Py_ssize_t n_storages = PyList_GET_SIZE(storages);
  const Py_ssize_t n_scalars = PyList_GET_SIZE(scalars);
  PyObject* scalar_forms = PyTuple_GET_ITEM(native, 6);
  TORCH_CHECK(PyTuple_GET_SIZE(scalar_forms) == n_scalars, "record: ", n_scalars, " runtime scalars for ",
              PyTuple_GET_SIZE(scalar_forms));
  THPObjectPtr refs(PyTuple_New(n_storages + n_scalars));
  if (!refs) throw python_error();
  {
    THPObjectPtr inputs = attr(graph, names.inputs);
    THPObjectPtr kept(PyLong_FromSsize_t(PyList_GET_SIZE(inputs.get())));
    if (!kept) throw python_error();
    try {
      for (Py_ssize_t i = 0; i < n_storages; ++i) {
        PyTuple_SET_ITEM(refs.get(), i, input_ref(executor, graph, PyList_GET_ITEM(storages, i)).release());
      }
      for (Py_ssize_t i = 0; i < n_scalars; ++i) {  // Defer._scalar_input: each its own input
        PyObject* form = PyTuple_GET_ITEM(scalar_forms, i);
        PyTuple_SET_ITEM(refs.get(), n_storages + i,
                         scalar_ref(executor, graph, PyList_GET_ITEM(scalars, i), PyTuple_GET_ITEM(form, 0),
                                    PyTuple_GET_ITEM(form, 1)).release());
      }
    } catch (...) {  // the op is not recorded: nor are its inputs
      PyObject *type, *value, *traceback;
      PyErr_Fetch(&type, &value, &traceback);
      THPObjectPtr dropped(PyObject_CallFunctionObjArgs(types.drop_inputs, graph, kept.get(), nullptr));
      PyErr_Restore(type, value, traceback);
      throw;
    }
  }
  {  // one step down the trie
    THPObjectPtr step(pair(PyTuple_GET_ITEM(native, 0), refs.get()));
    THPObjectPtr node = attr(graph, names.node);
    THPObjectPtr children = attr(node, names.children);
    if (!step) throw python_error();
    PyObject* child = PyDict_GetItemWithError(children, step);  // borrowed
    THPObjectPtr owned;
    if (child == nullptr) {
      if (PyErr_Occurred()) throw python_error();
      owned = call_method(executor, names.child, {node.get(), step.get()});
      child = owned.get();
    }
    set_attr(graph, names.node, child);
  }
  PyObject* shapes = PyTuple_GET_ITEM(native, 1);
  const Py_ssize_t n_results = PyTuple_GET_SIZE(shapes);
  THPObjectPtr graph_values = attr(graph, names.values);
  const Py_ssize_t first = PyList_GET_SIZE(graph_values.get());
  THPObjectPtr results(PyList_New(n_results));
  if (!results) throw python_error();
  THPObjectPtr empty(PyTuple_New(0));
  if (!empty) throw python_error();
  auto* pending_type = reinterpret_cast<PyTypeObject*>(types.pending);
  for (Py_ssize_t i = 0; i < n_results; ++i) {  // Pending(shape, graph, first + i), without its Python __init__
    THPObjectPtr p(PyBaseObject_Type.tp_new(pending_type, empty, nullptr));
    THPObjectPtr index(PyLong_FromSsize_t(first + i));
    if (!p || !index) throw python_error();
    set_attr(p, names.shape, PyTuple_GET_ITEM(shapes, i));
    set_attr(p, names.array, Py_None);
    set_attr(p, names.graph, graph);
    set_attr(p, names.index, index);
    THPObjectPtr ref(PyWeakref_NewRef(p, nullptr));
    if (!ref || PyList_Append(graph_values, ref) < 0) throw python_error();
    PyList_SET_ITEM(results.get(), i, p.release());
  }
  {
    PyObject* const frame_args[2] = {types.frame_prefixes, types.frame_cache};
    THPObjectPtr where(user_frame(nullptr, frame_args, 2));
    THPObjectPtr start(PyLong_FromSsize_t(first));
    if (!where || !start) throw python_error();
    THPObjectPtr fields(PyTuple_Pack(4, entry, refs.get(), start.get(), where.get()));
    THPObjectPtr packed(fields ? PyTuple_Pack(1, fields.get()) : nullptr);
    THPObjectPtr rec(packed ? PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject*>(types.record), packed, nullptr)
                            : nullptr);
    if (!rec || PyList_Append(records, rec) < 0) throw python_error();
  }
  if (PyTuple_GET_ITEM(native, 2) == Py_True) set_attr(graph, names.random, Py_True);
  {
    THPObjectPtr task(PyObject_CallNoArgs(types.graph_task));
    if (!task) throw python_error();
    if (PyLong_AsLong(task) != -1) {  // inside a backward pass: its end flushes (once per pass)
      THPObjectPtr queued = attr(graph, names.backward_task);
      const int same = PyObject_RichCompareBool(queued, task, Py_EQ);
      if (same < 0) throw python_error();
      if (!same) call_method(executor, names.after_backward, {graph});
    }
  }
  PyObject* mutated = PyTuple_GET_ITEM(native, 3);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mutated); ++i) {
    PyObject* m = PyTuple_GET_ITEM(mutated, i);
    PyObject* storage = PyList_GET_ITEM(storages, PyLong_AsSsize_t(PyTuple_GET_ITEM(m, 0)));
    call_method(storage, names.set, {PyList_GET_ITEM(results.get(), PyLong_AsSsize_t(PyTuple_GET_ITEM(m, 1)))});
  }
  PyObject* forms = PyTuple_GET_ITEM(native, 4);
  if (PyTuple_GET_ITEM(native, 5) == Py_True) return return_value(PyTuple_GET_ITEM(forms, 0), values, results);
  const Py_ssize_t n_returns = PyTuple_GET_SIZE(forms);
  if (n_returns == 0) Py_RETURN_NONE;
  THPObjectPtr out(PyTuple_New(n_returns));
  if (!out) throw python_error();
  for (Py_ssize_t i = 0; i < n_returns; ++i) {
    PyTuple_SET_ITEM(out.get(), i, return_value(PyTuple_GET_ITEM(forms, i), values, results));
  }
  return out.release();
  END_HANDLE_TH_ERRORS
}

// --- a DeviceStorage's torch storage (storage.torch_storage) -------------------------------------

PyObject* from_pointer = nullptr;  // torch._C._construct_storage_from_data_pointer
PyObject* device_object = nullptr;  // torch.device("tpu", 0)
PyObject* address_name = nullptr;
PyObject* nbytes_name = nullptr;

PyObject* set_storage_maker(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 2, "set_storage_maker(from_pointer, device)");
  Py_INCREF(args[0]);
  Py_INCREF(args[1]);
  from_pointer = args[0];
  device_object = args[1];
  intern({{&address_name, "address"}, {&nbytes_name, "nbytes"}, {&tpu_name, "_tpu"}});
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// torch_storage(storage) -> a torch.UntypedStorage over the storage's address range, whose
// `_tpu` is the storage (storage.torch_storage's twin)
PyObject* torch_storage(PyObject*, PyObject* storage) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(from_pointer != nullptr, "torch_storage before set_storage_maker");
  THPObjectPtr address(PyObject_GetAttr(storage, address_name));
  THPObjectPtr nbytes(PyObject_GetAttr(storage, nbytes_name));
  if (!address || !nbytes) throw python_error();
  PyObject* const args[3] = {address.get(), device_object, nbytes.get()};
  THPObjectPtr untyped(PyObject_Vectorcall(from_pointer, args, 3, nullptr));
  if (!untyped || PyObject_SetAttr(untyped, tpu_name, storage) < 0) throw python_error();
  return untyped.release();
  END_HANDLE_TH_ERRORS
}

// --- storage accounting (storage.DeviceStorage: every op result makes one) --------------------

// What storage._python_account keeps under its lock, as atomics: bytes allocated, their peak,
// and the next storage address (each storage its own 64-byte-aligned range, never reused).
std::atomic<int64_t> allocated_bytes{0};
std::atomic<int64_t> peak_bytes{0};
std::atomic<int64_t> next_address{0};

PyObject* start_accounting(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 3, "start_accounting(allocated, peak, next_address)");
  allocated_bytes = PyLong_AsLongLong(args[0]);
  peak_bytes = PyLong_AsLongLong(args[1]);
  next_address = PyLong_AsLongLong(args[2]);
  if (PyErr_Occurred()) throw python_error();
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// account(nbytes) -> the new storage's address
PyObject* account(PyObject*, PyObject* nbytes_object) {
  HANDLE_TH_ERRORS
  const int64_t nbytes = PyLong_AsLongLong(nbytes_object);
  if (nbytes == -1 && PyErr_Occurred()) throw python_error();
  const int64_t address = next_address.fetch_add((nbytes / 64 + 1) * 64);
  const int64_t now = allocated_bytes.fetch_add(nbytes) + nbytes;
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
  return PyLong_FromLongLong(address);
  END_HANDLE_TH_ERRORS
}

PyObject* release(PyObject*, PyObject* nbytes_object) {
  HANDLE_TH_ERRORS
  const int64_t nbytes = PyLong_AsLongLong(nbytes_object);
  if (nbytes == -1 && PyErr_Occurred()) throw python_error();
  allocated_bytes.fetch_sub(nbytes);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// memory() -> (allocated, peak, next address)
PyObject* memory(PyObject*, PyObject*) {
  return Py_BuildValue("(LLL)", static_cast<long long>(allocated_bytes.load()),
                       static_cast<long long>(peak_bytes.load()), static_cast<long long>(next_address.load()));
}

PyObject* reset_peak(PyObject*, PyObject*) {
  peak_bytes = allocated_bytes.load();
  Py_RETURN_NONE;
}

// --- defer mode's whole path for a known op, from torch's call of the kernel ---------------------

// Set once (defer.use_native): what run_deferred reads on every call.
struct DeferState {
  PyObject* eager = nullptr;     // the torchtpu.eager module (its `current` mode)
  PyObject* defer_mode = nullptr;  // "defer"
  PyObject* executor = nullptr;  // defer.executor
  PyObject* strict = nullptr;    // strict._strict (its _baked keys)
  PyObject* schemas = nullptr;   // call._SCHEMAS: id(op) -> Schema
  PyObject *current, *entries, *baked, *lock, *graph, *native, *codes, *names_, *defaults, *acquire, *release;
} state;

PyObject* set_defer_state(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 4, "set_defer_state(eager, executor, strict, schemas)");
  PyObject** slots[] = {&state.eager, &state.executor, &state.strict, &state.schemas};
  for (Py_ssize_t i = 0; i < nargs; ++i) {  // set again by defer.use_native(on=False) and back
    Py_INCREF(args[i]);
    Py_XSETREF(*slots[i], args[i]);
  }
  intern({{&state.defer_mode, "defer"}, {&state.current, "current"}, {&state.entries, "_entries"},
          {&state.baked, "_baked"}, {&state.lock, "_lock"}, {&state.graph, "graph"}, {&state.native, "native"},
          {&state.codes, "codes"}, {&state.names_, "names"}, {&state.defaults, "defaults"},
          {&state.acquire, "acquire"}, {&state.release, "release"}});
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* describe(PyObject*, PyObject* const* args, Py_ssize_t nargs);  // above

// The op's return value recorded in defer mode, or nullptr with no error: Python's path runs it.
PyObject* defer_known(PyObject* op, PyObject* args, PyObject* kwargs) {
  if (state.executor == nullptr || state.executor == Py_None) return nullptr;
  THPObjectPtr mode(PyObject_GetAttr(state.eager, state.current));
  if (!mode) throw python_error();
  if (mode.get() != state.defer_mode && PyUnicode_Compare(mode, state.defer_mode) != 0) return nullptr;
  THPObjectPtr op_id(PyLong_FromVoidPtr(op));
  if (!op_id) throw python_error();
  PyObject* schema = PyDict_GetItemWithError(state.schemas, op_id);  // borrowed
  if (schema == nullptr) {
    if (PyErr_Occurred()) throw python_error();
    return nullptr;  // an op Python's path has not met yet
  }
  THPObjectPtr codes = attr(schema, state.codes);
  THPObjectPtr names_ = attr(schema, state.names_);
  THPObjectPtr defaults = attr(schema, state.defaults);
  const auto default_dtype = c10::typeMetaToScalarType(c10::get_default_dtype());
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(default_dtype));  // borrowed
  PyObject* const describe_args[8] = {codes.get(), names_.get(), defaults.get(), op_id.get(), args,
                                      kwargs ? kwargs : Py_None, Py_True, dtype};
  THPObjectPtr parts(describe(nullptr, describe_args, 8));
  if (!parts) throw python_error();
  if (parts.get() == Py_None) return nullptr;
  PyObject* values = PyTuple_GET_ITEM(parts.get(), 0);
  PyObject* storages = PyTuple_GET_ITEM(parts.get(), 2);
  PyObject* scalars = PyTuple_GET_ITEM(parts.get(), 3);
  PyObject* key = PyTuple_GET_ITEM(parts.get(), 4);
  THPObjectPtr baked = attr(state.strict, state.baked);
  if (PySet_GET_SIZE(baked.get()) != 0) {
    const int contains = PySet_Contains(baked, key);
    if (contains < 0) throw python_error();
    if (contains) return nullptr;
  }
  THPObjectPtr entries = attr(state.executor, state.entries);
  PyObject* entry = PyDict_GetItemWithError(entries, key);  // borrowed
  if (entry == nullptr) {
    if (PyErr_Occurred()) throw python_error();
    return nullptr;
  }
  THPObjectPtr native = attr(entry, state.native);
  if (native.get() == Py_None) return nullptr;
  THPObjectPtr lock = attr(state.executor, state.lock);
  THPObjectPtr acquired(PyObject_CallMethodNoArgs(lock, state.acquire));
  if (!acquired) throw python_error();
  PyObject* out = nullptr;
  {
    THPObjectPtr graph(PyObject_GetAttr(state.executor, state.graph));
    if (graph) {
      PyObject* const record_args[7] = {state.executor, graph.get(), entry, native.get(), storages, values, scalars};
      out = record(nullptr, record_args, 7);
    }
  }
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);  // the release must not lose record's error
  THPObjectPtr released(PyObject_CallMethodNoArgs(lock, state.release));
  if (!released) {
    Py_XDECREF(out);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    throw python_error();
  }
  PyErr_Restore(type, value, traceback);
  if (out == nullptr) throw python_error();
  if (out == types.declined) {
    Py_DECREF(out);
    return nullptr;
  }
  return out;
}

// run_kernel(kernel, *args, **kwargs): a kernel of kernels.py (its `op`, or None until Python's
// path resolved it); in defer mode a known op is recorded here, anything else is kernel(*args, **kwargs).
PyObject* run_kernel(PyObject*, PyObject* all, PyObject* kwargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(PyTuple_GET_SIZE(all) >= 1, "run_kernel(kernel, *args, **kwargs)");
  PyObject* kernel = PyTuple_GET_ITEM(all, 0);
  THPObjectPtr args(PyTuple_GetSlice(all, 1, PyTuple_GET_SIZE(all)));
  if (!args) throw python_error();
  THPObjectPtr op(PyObject_GetAttrString(kernel, "op"));
  if (!op) throw python_error();
  if (op.get() != Py_None) {
    PyObject* out = defer_known(op, args, kwargs);
    if (out != nullptr) return out;
  }
  return PyObject_Call(kernel, args, kwargs);
  END_HANDLE_TH_ERRORS
}

// run_known(op, args, kwargs): defer mode's record of a known op, or `declined` (the device's
// fallback kernel, registered before the library loads, asks here first).
PyObject* run_known(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK(nargs == 3 && PyTuple_Check(args[1]), "run_known(op, args, kwargs)");
  PyObject* out = defer_known(args[0], args[1], args[2] == Py_None ? nullptr : args[2]);
  if (out != nullptr) return out;
  Py_INCREF(types.declined);
  return types.declined;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"make_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(make_tensor)), METH_FASTCALL,
     "make_tensor(storage, size, stride, offset, dtype): a tpu tensor over the storage"},
    {"set_marker_types", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_marker_types)), METH_FASTCALL,
     "set_marker_types(TENSOR, torch.Size): what tensor_marker builds its markers of"},
    {"tensor_marker", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(tensor_marker)), METH_FASTCALL,
     "tensor_marker(t, index, storages): call._State.tensor's marker, or None for Python's path"},
    {"user_frame", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(user_frame)), METH_FASTCALL,
     "user_frame(prefixes, cache): call.user_frame's (filename, line, function)"},
    {"set_describe_types", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_describe_types)),
     METH_FASTCALL,
     "set_describe_types(SCALAR, DEVICE, 'number', torch.int64, math.nan, torch.device, torch.Generator)"},
    {"set_record_types", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_record_types)), METH_FASTCALL,
     "set_record_types(Pending, Record, DeviceStorage, graph_task, drop_inputs, prefixes, cache, declined, "
     "scalar_arrays)"},
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(record)), METH_FASTCALL,
     "record(executor, graph, entry, native, storages, values, scalars): Defer.run's record of a known op, or "
     "declined"},
    {"set_storage_maker", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_storage_maker)),
     METH_FASTCALL, "set_storage_maker(torch._C._construct_storage_from_data_pointer, device)"},
    {"torch_storage", torch_storage, METH_O, "torch_storage(storage): storage.torch_storage's twin"},
    {"start_accounting", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(start_accounting)),
     METH_FASTCALL, "start_accounting(allocated, peak, next_address): storage's counters from now on"},
    {"account", account, METH_O, "account(nbytes) -> address: storage._python_account's twin"},
    {"release", release, METH_O, "release(nbytes): storage._python_release's twin"},
    {"memory", memory, METH_NOARGS, "memory() -> (allocated, peak, next address)"},
    {"reset_peak", reset_peak, METH_NOARGS, "reset_peak(): the peak is what is allocated now"},
    {"set_defer_state", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_defer_state)), METH_FASTCALL,
     "set_defer_state(eager, executor, strict, schemas): what run_kernel and run_fallback read"},
    {"run_kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run_kernel)),
     METH_VARARGS | METH_KEYWORDS, "run_kernel(kernel, *args, **kwargs): a kernel's call, a known op recorded here"},
    {"run_known", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run_known)), METH_FASTCALL,
     "run_known(op, args, kwargs): defer mode's record of a known op, or declined"},
    {"describe", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(describe)), METH_FASTCALL,
     "describe(codes, names, defaults, op_id, args, kwargs, lift, default_dtype): call.describe's parts, or None"},
    {nullptr, nullptr, 0, nullptr}};
PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchtpu.device._native", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__native() { return PyModule_Create(&module); }
