// XLA FFI handlers that run ATen's CPU kernels (oneDNN) inside an XLA:CPU program.
//
// Built and registered by torchtpu/kernels/aten_cpu.py; the convolution, grouped-matmul and attention rules
// call them on the CPU platform only (docs/DECISIONS.md). Operands and results are XLA buffers, row-major or (with
// the `channels_last` attribute) channels-minor, wrapped as ATen tensors of that memory format
// without copying; the result is copied into XLA's output buffer, or (float32 2d) computed there.
// Where XLA's intra-op pool has two threads or more, the convolution forward and the attention
// kernels run in blocks of the batch (and heads) on that pool, each block at one thread, instead
// of on an OpenMP team of ATen's (OnPool; docs/DECISIONS.md 121).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
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

// OpenMP's and MKL's per-thread thread counts, from the libgomp and MKL torch loads; weak: a torch
// built without either leaves them null.
extern "C" {
__attribute__((weak)) int MKL_Set_Num_Threads_Local(int nthreads);  // mkl_set_num_threads_local in mkl.h
__attribute__((weak)) int omp_get_max_threads(void);
__attribute__((weak)) void omp_set_num_threads(int nthreads);
}

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

// Runs body(i) for every i in [0, n) on this thread and on XLA's intra-op pool: each helper the
// pool starts takes items from a shared counter, and this thread takes whatever is left, so it
// never waits for a task the pool has not started (the pool may be busy with other thunks).
void PoolFor(ffi::ThreadPool& pool, int64_t n, const std::function<void(int64_t)>& body) {
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
    int64_t n;
    const std::function<void(int64_t)>* body;
  };
  auto shared = std::make_shared<Shared>();
  shared->n = n;
  shared->body = &body;
  auto work = [](Shared& s) {
    for (int64_t i; (i = s.next.fetch_add(1)) < s.n;) {
      (*s.body)(i);
      s.done.fetch_add(1, std::memory_order_release);
    }
  };
  int64_t helpers = std::min<int64_t>(pool.num_threads(), n) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([shared, work] { work(*shared); });
  work(*shared);
  while (shared->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

// While alive, ATen's loops and MKL run on this thread alone (no OpenMP team of its own).
class OneThread {
 public:
  OneThread() {
    if (omp_get_max_threads && omp_set_num_threads) {
      omp_ = omp_get_max_threads();
      omp_set_num_threads(1);
    }
    if (MKL_Set_Num_Threads_Local) mkl_ = MKL_Set_Num_Threads_Local(1);
  }
  ~OneThread() {
    if (omp_ > 0) omp_set_num_threads(omp_);
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(mkl_);
  }

 private:
  int omp_ = 0, mkl_ = 0;
};

// Runs body(b, nb, h, nh) over blocks of a [batch, heads] grid, one block per thread of XLA's
// intra-op pool, each on one thread (ATen's loops and MKL alike): whole batch ranges when the batch
// has as many entries as the pool has threads, else head ranges of each entry too. Returns false,
// running nothing, where the pool has one thread or the grid one entry: the caller then runs the
// whole on ATen's own threads. What a block throws is rethrown here.
bool OnPool(ffi::ThreadPool& pool, int64_t batch, int64_t heads,
            const std::function<void(int64_t, int64_t, int64_t, int64_t)>& body) {
  int64_t threads = pool.num_threads();
  if (threads < 2 || batch * heads < 2) return false;
  int64_t nb = std::min(batch, threads), nh = batch >= threads ? 1 : std::min(heads, (threads + batch - 1) / batch);
  int64_t sb = (batch + nb - 1) / nb, sh = (heads + nh - 1) / nh;
  nb = (batch + sb - 1) / sb;
  nh = (heads + sh - 1) / sh;
  std::mutex mu;
  std::exception_ptr failure;
  std::function<void(int64_t)> block = [&](int64_t i) {
    try {
      at::internal::lazy_init_num_threads();  // before OneThread: ATen's first parallel loop would reset it
      OneThread one;
      c10::InferenceMode guard;
      int64_t b = (i / nh) * sb, h = (i % nh) * sh;
      body(b, std::min(sb, batch - b), h, std::min(sh, heads - h));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!failure) failure = std::current_exception();
    }
  };
  PoolFor(pool, nb * nh, block);
  if (failure) std::rethrow_exception(failure);
  return true;
}

// The block [b, b + nb) x [h, h + nh) of a [batch, heads, ...] tensor, or of a mask that broadcasts
// to one (aligned from the right; a dim it lacks or has as 1 it keeps whole).
at::Tensor Block(const at::Tensor& t, int64_t b, int64_t nb, int64_t h, int64_t nh, int64_t rank = 4) {
  at::Tensor r = t;
  int64_t lead = t.dim() - rank;  // where dim 0 of the full shape sits in t (negative: absent)
  if (lead + 1 >= 0 && r.size(lead + 1) != 1) r = r.narrow(lead + 1, h, nh);
  if (lead >= 0 && r.size(lead) != 1) r = r.narrow(lead, b, nb);
  return r;
}

ffi::Error Convolution(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Span<const int64_t> stride, ffi::Span<const int64_t> padding,
                       ffi::Span<const int64_t> dilation, int64_t groups, int64_t channels_last) {
  at::ScalarType type;
  if (!ScalarType(x.element_type(), &type) || w.element_type() != x.element_type() ||
      out->element_type() != x.element_type()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "torchtpu_aten_convolution: unsupported dtype");
  }
  return Guarded("torchtpu_aten_convolution", [&] {
    at::Tensor input = Wrap(x.untyped_data(), x.dimensions(), type, channels_last);
    at::Tensor weight = Wrap(w.untyped_data(), w.dimensions(), type, channels_last);
    at::Tensor result = Wrap(out->untyped_data(), out->dimensions(), type, channels_last);
    auto run = [&](int64_t lo, int64_t len, int64_t, int64_t) {
      result.narrow(0, lo, len).copy_(at::convolution(
          input.narrow(0, lo, len), weight, std::nullopt, Vec(stride), Vec(padding), Vec(dilation),
          /*transposed=*/false, std::vector<int64_t>(stride.size(), 0), groups));
    };
    if (!OnPool(pool, input.size(0), 1, run)) run(0, input.size(0), 0, 1);
  });
}

// Convolution written straight into XLA's output buffer, which XLA filled with zeros (the zeros
// operand aliases the result): oneDNN adds the convolution into it in place (ATen's
// mkldnn::_convolution_pointwise_.binary, "add"), so no result is allocated and copied; with
// `has_bias` it adds the bias and with `relu` applies ReLU as it writes (oneDNN post-ops).
// 2d float32 channels-last only; where that op is missing, the plain call and a copy.
ffi::Error ConvolutionInto(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias,
                           ffi::AnyBuffer zeros, ffi::Result<ffi::AnyBuffer> out, ffi::Span<const int64_t> stride,
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
    at::Tensor whole_input = Wrap(x.untyped_data(), x.dimensions(), at::kFloat, true);
    at::Tensor weight = Wrap(w.untyped_data(), w.dimensions(), at::kFloat, true);
    at::Tensor whole_result = Wrap(out->untyped_data(), out->dimensions(), at::kFloat, true);
    std::optional<at::Tensor> b;
    if (has_bias) b = Wrap(bias.untyped_data(), bias.dimensions(), at::kFloat, false);
    auto run = [&](int64_t lo, int64_t len, int64_t, int64_t) {
      at::Tensor input = whole_input.narrow(0, lo, len), result = whole_result.narrow(0, lo, len);
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
    };
    if (!OnPool(pool, whole_input.size(0), 1, run)) run(0, whole_input.size(0), 0, 1);
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
ffi::Error AttentionForward(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer mask, ffi::Result<ffi::AnyBuffer> out,
                            ffi::Result<ffi::Buffer<ffi::F32>> logsumexp, int64_t is_causal, int64_t has_mask,
                            int64_t has_scale, double scale) {
  at::ScalarType type;
  if (!ScalarType(q.element_type(), &type) || k.element_type() != q.element_type() ||
      v.element_type() != q.element_type() || (has_mask && mask.element_type() != q.element_type())) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "torchtpu_aten_attention_forward: unsupported dtype");
  }
  return Guarded("torchtpu_aten_attention_forward", [&] {
    std::optional<at::Tensor> m;
    if (has_mask) m = Wrap(mask.untyped_data(), mask.dimensions(), type, false);
    at::Tensor tq = Wrap(q.untyped_data(), q.dimensions(), type, false);
    at::Tensor tk = Wrap(k.untyped_data(), k.dimensions(), type, false);
    at::Tensor tv = Wrap(v.untyped_data(), v.dimensions(), type, false);
    at::Tensor to = Wrap(out->untyped_data(), out->dimensions(), type, false);
    at::Tensor tl = Wrap(logsumexp->typed_data(), logsumexp->dimensions(), at::kFloat, false);
    auto run = [&](int64_t b, int64_t nb, int64_t h, int64_t nh) {
      auto part = [&](const at::Tensor& t) { return Block(t, b, nb, h, nh, t.dim()); };
      std::optional<at::Tensor> mp;
      if (m) mp = Block(*m, b, nb, h, nh);
      auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
          part(tq), part(tk), part(tv), /*dropout_p=*/0.0, is_causal != 0, mp,
          has_scale ? std::optional<double>(scale) : std::nullopt);
      part(to).copy_(o);
      part(tl).copy_(lse);
    };
    if (!OnPool(pool, tq.size(0), tq.size(1), run)) run(0, tq.size(0), 0, tq.size(1));
  });
}

// (d/dq, d/dk, d/dv) of scaled dot-product attention from the forward's output and logsumexp:
// ATen's CPU flash-attention backward, as eager's training step runs it. q, k, v, out and
// grad_out are [B, H, L, D] row-major of one dtype with as many kv heads as q heads; logsumexp
// is float32 [B, H, L]; `mask` (with has_mask) is an additive mask of q's dtype that
// broadcasts to [B, H, L, S].
ffi::Error AttentionBackward(ffi::ThreadPool pool, ffi::AnyBuffer grad_out, ffi::AnyBuffer q, ffi::AnyBuffer k,
                             ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::Buffer<ffi::F32> logsumexp, ffi::AnyBuffer mask,
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
    at::Tensor tg = Wrap(grad_out.untyped_data(), grad_out.dimensions(), type, false);
    at::Tensor tq = Wrap(q.untyped_data(), q.dimensions(), type, false);
    at::Tensor tk = Wrap(k.untyped_data(), k.dimensions(), type, false);
    at::Tensor tv = Wrap(v.untyped_data(), v.dimensions(), type, false);
    at::Tensor to = Wrap(out.untyped_data(), out.dimensions(), type, false);
    at::Tensor tl = Wrap(logsumexp.typed_data(), logsumexp.dimensions(), at::kFloat, false);
    at::Tensor gq = Wrap(grad_q->untyped_data(), grad_q->dimensions(), type, false);
    at::Tensor gk = Wrap(grad_k->untyped_data(), grad_k->dimensions(), type, false);
    at::Tensor gv = Wrap(grad_v->untyped_data(), grad_v->dimensions(), type, false);
    auto run = [&](int64_t b, int64_t nb, int64_t h, int64_t nh) {
      auto part = [&](const at::Tensor& t) { return Block(t, b, nb, h, nh, t.dim()); };
      std::optional<at::Tensor> mp;
      if (m) mp = Block(*m, b, nb, h, nh);
      auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          part(tg), part(tq), part(tk), part(tv), part(to), part(tl), /*dropout_p=*/0.0, is_causal != 0, mp,
          has_scale ? std::optional<double>(scale) : std::nullopt);
      part(gq).copy_(dq);
      part(gk).copy_(dk);
      part(gv).copy_(dv);
    };
    if (!OnPool(pool, tq.size(0), tq.size(1), run)) run(0, tq.size(0), 0, tq.size(1));
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
                                  .Ctx<ffi::ThreadPool>()
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
                                  .Ctx<ffi::ThreadPool>()
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
                                  .Ctx<ffi::ThreadPool>()
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
                                  .Ctx<ffi::ThreadPool>()
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
