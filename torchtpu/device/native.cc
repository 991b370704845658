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
// The library is also a CPython module (torchtpu.device._native) of three functions on every
// op's path (and set_marker_types, their setup), each doing what its Python twin does (which
// stays where the library is off):
//   make_tensor    the body of storage.wrap: a tpu tensor over a torch storage, with size,
//                  stride and offset (Python: an empty tensor and a redispatched set_, ~2.3 us
//                  for every result of every op; here ~0.6 us, the same tensor and bound check)
//   tensor_marker  call.py's marker of a tpu tensor argument, for the common case (its storage's
//                  dtype, not float64, not padded); anything else returns None to Python's path
//   user_frame     call.py's innermost frame outside torch and torchtpu (defer mode, per op)
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
  tpu_name = PyUnicode_InternFromString("_tpu");
  dtype_name = PyUnicode_InternFromString("dtype");
  padding_name = PyUnicode_InternFromString("padding");
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

PyMethodDef methods[] = {
    {"make_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(make_tensor)), METH_FASTCALL,
     "make_tensor(storage, size, stride, offset, dtype): a tpu tensor over the storage"},
    {"set_marker_types", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(set_marker_types)), METH_FASTCALL,
     "set_marker_types(TENSOR, torch.Size): what tensor_marker builds its markers of"},
    {"tensor_marker", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(tensor_marker)), METH_FASTCALL,
     "tensor_marker(t, index, storages): call._State.tensor's marker, or None for Python's path"},
    {"user_frame", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(user_frame)), METH_FASTCALL,
     "user_frame(prefixes, cache): call.user_frame's (filename, line, function)"},
    {nullptr, nullptr, 0, nullptr}};
PyModuleDef module = {PyModuleDef_HEAD_INIT, "torchtpu.device._native", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__native() { return PyModule_Create(&module); }
