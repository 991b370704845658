// The eager tpu device's C++ registrations (device/native.py builds and loads this file).
//
// torch.nn.functional.scaled_dot_product_attention asks a per-device stub which kernel to use;
// a Python backend cannot answer it, so tpu tensors took the math path: ~13 ops and ~20 views
// per call forward, ~11 ops backward, each its own program (strict) or step (defer). Here the
// stub answers "overrideable" where the device's fused kernel (device/attention.py: one
// program, forward or backward) computes what the math path would, and "math" elsewhere:
// dropout, a mask that needs a gradient, key/value heads that differ without enable_gqa, or
// tensors a tracer holds (FakeTensor, functionalization: torch.compile keeps the graph it had).
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>

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
