// XLA FFI handlers that run ATen's CPU kernels (oneDNN) inside an XLA:CPU program.
//
// Built and registered by torchtpu/kernels/aten_cpu.py; the convolution, grouped-matmul and attention rules
// call them on the CPU platform only (docs/DECISIONS.md). Operands and results are XLA buffers, row-major or (with
// the `channels_last` attribute) channels-minor, wrapped as ATen tensors of that memory format
// without copying; the result is copied into XLA's output buffer, or (float32 2d) computed there.
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/_grouped_mm.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <c10/core/InferenceMode.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

bool ScalarType(ffi::DataType type, at::ScalarType* out) {
  switch (type) {
    case ffi::DataType::F32: *out = at::kFloat; return true;
    case ffi::DataType::F64: *out = at::kDouble; return true;
    case ffi::DataType::BF16: *out = at::kBFloat16; return true;
    default: return false;
  }
}

// An XLA buffer as an ATen tensor of the same logical dims (N, C, spatial...), no copy. With
// `channels_last` the buffer's layout is channels-minor (XLA was asked for it), so are the strides.
at::Tensor Wrap(void* data, ffi::Span<const int64_t> dims, at::ScalarType type, bool channels_last) {
  std::vector<int64_t> sizes(dims.begin(), dims.end());
  std::vector<int64_t> strides(sizes.size(), 1);
  if (channels_last && sizes.size() > 2) {
    int64_t step = sizes[1];
    for (size_t d = sizes.size() - 1; d >= 2; --d) { strides[d] = step; step *= sizes[d]; }
    strides[0] = step;
  } else {
    for (size_t d = sizes.size() - 1; d > 0; --d) strides[d - 1] = strides[d] * sizes[d];
  }
  return at::from_blob(data, sizes, strides, at::TensorOptions().dtype(type));
}

std::vector<int64_t> Vec(ffi::Span<const int64_t> s) { return {s.begin(), s.end()}; }

// Runs one ATen kernel on this XLA thread; what it throws becomes the FFI error, prefixed by `name`.
ffi::Error Guarded(const char* name, const std::function<void()>& body) {
  try {
    // this XLA thread takes torch's thread count once, as each of torch's own threads does
    // (at::init_num_threads on every call would also clear oneDNN's primitive cache each time)
    at::internal::lazy_init_num_threads();
    c10::InferenceMode guard;
    body();
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string(name) + ": " + e.what());
  }
  return ffi::Error::Success();
}

ffi::Error Convolution(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Span<const int64_t> stride, ffi::Span<const int64_t> padding,
                       ffi::Span<const int64_t> dilation, int64_t groups, int64_t channels_last) {
  at::ScalarType type;
  if (!ScalarType(x.element_type(), &type) || w.element_type() != x.element_type() ||
      out->element_type() != x.element_type()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "torchtpu_aten_convolution: unsupported dtype");
  }
  return Guarded("torchtpu_aten_convolution", [&] {
    at::Tensor result = at::convolution(
        Wrap(x.untyped_data(), x.dimensions(), type, channels_last),
        Wrap(w.untyped_data(), w.dimensions(), type, channels_last), std::nullopt, Vec(stride), Vec(padding),
        Vec(dilation), /*transposed=*/false, std::vector<int64_t>(stride.size(), 0), groups);
    Wrap(out->untyped_data(), out->dimensions(), type, channels_last).copy_(result);
  });
}

// Convolution written straight into XLA's output buffer, which XLA filled with zeros (the zeros
// operand aliases the result): oneDNN adds the convolution into it in place (ATen's
// mkldnn::_convolution_pointwise_.binary, "add"), so no result is allocated and copied; with
// `has_bias` it adds the bias and with `relu` applies ReLU as it writes (oneDNN post-ops).
// 2d float32 channels-last only; where that op is missing, the plain call and a copy.
ffi::Error ConvolutionInto(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias, ffi::AnyBuffer zeros,
                           ffi::Result<ffi::AnyBuffer> out, ffi::Span<const int64_t> stride,
                           ffi::Span<const int64_t> padding, ffi::Span<const int64_t> dilation, int64_t groups,
                           int64_t has_bias, int64_t relu) {
  if (x.element_type() != ffi::DataType::F32 || w.element_type() != ffi::DataType::F32 ||
      bias.element_type() != ffi::DataType::F32 || out->element_type() != ffi::DataType::F32 ||
      x.dimensions().size() != 4) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "torchtpu_aten_convolution_into: 2d float32 only");
  }
  static const std::optional<c10::OperatorHandle> add_into =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_convolution_pointwise_", "binary"});
  return Guarded("torchtpu_aten_convolution_into", [&] {
    at::Tensor input = Wrap(x.untyped_data(), x.dimensions(), at::kFloat, true);
    at::Tensor weight = Wrap(w.untyped_data(), w.dimensions(), at::kFloat, true);
    at::Tensor result = Wrap(out->untyped_data(), out->dimensions(), at::kFloat, true);
    std::optional<at::Tensor> b;
    if (has_bias) b = Wrap(bias.untyped_data(), bias.dimensions(), at::kFloat, false);
    if (add_into) {
      torch::jit::Stack stack{result, input, weight, b ? c10::IValue(*b) : c10::IValue(), Vec(padding), Vec(stride),
                              Vec(dilation), groups, std::string("add"), c10::IValue(),
                              relu ? c10::IValue(std::string("relu")) : c10::IValue(),
                              c10::List<std::optional<at::Scalar>>(), c10::IValue()};
      add_into->callBoxed(&stack);
    } else {
      result.copy_(at::convolution(input, weight, b, Vec(stride), Vec(padding), Vec(dilation), false,
                                   std::vector<int64_t>(stride.size(), 0), groups));
      if (relu) result.relu_();
    }
  });
}

// d(loss)/d(x) and d(loss)/d(w) of Convolution, from d(loss)/d(out); a result whose mask is 0
// is left unwritten (the rule drops it).
ffi::Error ConvolutionBackward(ffi::AnyBuffer grad, ffi::AnyBuffer x, ffi::AnyBuffer w,
                               ffi::Result<ffi::AnyBuffer> grad_x, ffi::Result<ffi::AnyBuffer> grad_w,
                               ffi::Span<const int64_t> stride, ffi::Span<const int64_t> padding,
                               ffi::Span<const int64_t> dilation, int64_t groups, int64_t mask_x,
                               int64_t mask_w, int64_t channels_last) {
  at::ScalarType type;
  if (!ScalarType(x.element_type(), &type) || w.element_type() != x.element_type() ||
      grad.element_type() != x.element_type()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "torchtpu_aten_convolution_backward: unsupported dtype");
  }
  return Guarded("torchtpu_aten_convolution_backward", [&] {
    auto [gx, gw, gb] = at::convolution_backward(
        Wrap(grad.untyped_data(), grad.dimensions(), type, channels_last),
        Wrap(x.untyped_data(), x.dimensions(), type, channels_last),
        Wrap(w.untyped_data(), w.dimensions(), type, channels_last), std::nullopt, Vec(stride), Vec(padding),
        Vec(dilation),
        /*transposed=*/false, std::vector<int64_t>(stride.size(), 0), groups, {mask_x != 0, mask_w != 0, false});
    if (mask_x) Wrap(grad_x->untyped_data(), grad_x->dimensions(), type, channels_last).copy_(gx);
    if (mask_w) Wrap(grad_w->untyped_data(), grad_w->dimensions(), type, channels_last).copy_(gw);
  });
}

// torch._grouped_mm(a, b, offs) (MoE experts): each group's rows, columns or contraction range
// multiplied with its own matrix, so no group pays for the others (XLA:CPU's ragged dot is a dense
// product masked per group: G times the work). Whatever lies past offs[-1] comes out zero.
ffi::Error GroupedMm(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Buffer<ffi::S32> offs, ffi::Result<ffi::AnyBuffer> out) {
  at::ScalarType type;
  if (!ScalarType(a.element_type(), &type) || b.element_type() != a.element_type() ||
      out->element_type() != a.element_type()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "torchtpu_aten_grouped_mm: unsupported dtype");
  }
  return Guarded("torchtpu_aten_grouped_mm", [&] {
    at::Tensor ta = Wrap(a.untyped_data(), a.dimensions(), type, false);
    at::Tensor tb = Wrap(b.untyped_data(), b.dimensions(), type, false);
    at::Tensor to = Wrap(offs.typed_data(), offs.dimensions(), at::kInt, false);
    at::Tensor result = Wrap(out->untyped_data(), out->dimensions(), type, false);
    int64_t end = offs.element_count() ? offs.typed_data()[offs.element_count() - 1] : 0;
    result.copy_(at::_grouped_mm(ta, tb, to));
    if (ta.dim() == 2 && tb.dim() == 3 && end < result.size(0)) {
      result.narrow(0, end, result.size(0) - end).zero_();  // rows in no group
    } else if (ta.dim() == 3 && tb.dim() == 2 && end < result.size(1)) {
      result.narrow(1, end, result.size(1) - end).zero_();  // columns in no group
    }
  });
}

// Scaled dot-product attention's output and float32 logsumexp ([B, H, L]): ATen's CPU flash-attention
// forward, as eager runs it. q, k, v are [B, H, L|S, D] row-major of one dtype with as many kv heads
// as q heads; `mask` (with has_mask) is an additive mask of q's dtype that broadcasts to [B, H, L, S].
ffi::Error AttentionForward(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer mask,
                     ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> logsumexp, int64_t is_causal,
                     int64_t has_mask, int64_t has_scale, double scale) {
  at::ScalarType type;
  if (!ScalarType(q.element_type(), &type) || k.element_type() != q.element_type() ||
      v.element_type() != q.element_type() || (has_mask && mask.element_type() != q.element_type())) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "torchtpu_aten_attention_forward: unsupported dtype");
  }
  return Guarded("torchtpu_aten_attention_forward", [&] {
    std::optional<at::Tensor> m;
    if (has_mask) m = Wrap(mask.untyped_data(), mask.dimensions(), type, false);
    auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
        Wrap(q.untyped_data(), q.dimensions(), type, false), Wrap(k.untyped_data(), k.dimensions(), type, false),
        Wrap(v.untyped_data(), v.dimensions(), type, false), /*dropout_p=*/0.0, is_causal != 0, m,
        has_scale ? std::optional<double>(scale) : std::nullopt);
    Wrap(out->untyped_data(), out->dimensions(), type, false).copy_(o);
    Wrap(logsumexp->typed_data(), logsumexp->dimensions(), at::kFloat, false).copy_(lse);
  });
}

// (d/dq, d/dk, d/dv) of scaled dot-product attention from the forward's output and logsumexp:
// ATen's CPU flash-attention backward, as eager's training step runs it. q, k, v, out and
// grad_out are [B, H, L, D] row-major of one dtype with as many kv heads as q heads; logsumexp
// is float32 [B, H, L]; `mask` (with has_mask) is an additive mask of q's dtype that
// broadcasts to [B, H, L, S].
ffi::Error AttentionBackward(ffi::AnyBuffer grad_out, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                             ffi::AnyBuffer out, ffi::Buffer<ffi::F32> logsumexp, ffi::AnyBuffer mask,
                             ffi::Result<ffi::AnyBuffer> grad_q, ffi::Result<ffi::AnyBuffer> grad_k,
                             ffi::Result<ffi::AnyBuffer> grad_v, int64_t is_causal, int64_t has_mask,
                             int64_t has_scale, double scale) {
  at::ScalarType type;
  if (!ScalarType(q.element_type(), &type) || k.element_type() != q.element_type() ||
      v.element_type() != q.element_type() || out.element_type() != q.element_type() ||
      grad_out.element_type() != q.element_type() || (has_mask && mask.element_type() != q.element_type())) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "torchtpu_aten_attention_backward: unsupported dtype");
  }
  return Guarded("torchtpu_aten_attention_backward", [&] {
    std::optional<at::Tensor> m;
    if (has_mask) m = Wrap(mask.untyped_data(), mask.dimensions(), type, false);
    auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        Wrap(grad_out.untyped_data(), grad_out.dimensions(), type, false),
        Wrap(q.untyped_data(), q.dimensions(), type, false), Wrap(k.untyped_data(), k.dimensions(), type, false),
        Wrap(v.untyped_data(), v.dimensions(), type, false), Wrap(out.untyped_data(), out.dimensions(), type, false),
        Wrap(logsumexp.typed_data(), logsumexp.dimensions(), at::kFloat, false), /*dropout_p=*/0.0,
        is_causal != 0, m, has_scale ? std::optional<double>(scale) : std::nullopt);
    Wrap(grad_q->untyped_data(), grad_q->dimensions(), type, false).copy_(gq);
    Wrap(grad_k->untyped_data(), grad_k->dimensions(), type, false).copy_(gk);
    Wrap(grad_v->untyped_data(), grad_v->dimensions(), type, false).copy_(gv);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TorchtpuAtenGroupedMm, GroupedMm,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(TorchtpuAtenConvolutionBackward, ConvolutionBackward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("stride")
                                  .Attr<ffi::Span<const int64_t>>("padding")
                                  .Attr<ffi::Span<const int64_t>>("dilation")
                                  .Attr<int64_t>("groups")
                                  .Attr<int64_t>("mask_x")
                                  .Attr<int64_t>("mask_w")
                                  .Attr<int64_t>("channels_last"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TorchtpuAtenConvolution, Convolution,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("stride")
                                  .Attr<ffi::Span<const int64_t>>("padding")
                                  .Attr<ffi::Span<const int64_t>>("dilation")
                                  .Attr<int64_t>("groups")
                                  .Attr<int64_t>("channels_last"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TorchtpuAtenConvolutionInto, ConvolutionInto,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("stride")
                                  .Attr<ffi::Span<const int64_t>>("padding")
                                  .Attr<ffi::Span<const int64_t>>("dilation")
                                  .Attr<int64_t>("groups")
                                  .Attr<int64_t>("has_bias")
                                  .Attr<int64_t>("relu"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TorchtpuAtenAttentionForward, AttentionForward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("is_causal")
                                  .Attr<int64_t>("has_mask")
                                  .Attr<int64_t>("has_scale")
                                  .Attr<double>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TorchtpuAtenAttentionBackward, AttentionBackward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("is_causal")
                                  .Attr<int64_t>("has_mask")
                                  .Attr<int64_t>("has_scale")
                                  .Attr<double>("scale"));
