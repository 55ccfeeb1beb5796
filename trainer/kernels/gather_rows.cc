// An online table's lookup in training, fused: a step's distinct ids have their rows (`slots`,
// -1 for an id without one) and each key its place among them (`index`); the stock path takes
// a partition of the slots, a gather of each row once, a stitch with zero rows and a gather by
// `index` (and as many ops again for the gradient). These two kernels copy each key's row, or
// zeros, once, and sum the gradient of each row in the order the stock segment sum does, so
// that both paths give the same floats.
#include <algorithm>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace recpipe {
namespace {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Var;
using tensorflow::errors::FailedPrecondition;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// slots int64 [U] and index int64 [N], each index in [0, U); false (the context failed) otherwise
bool CheckIndex(OpKernelContext* ctx, const Tensor& slots, const Tensor& index) {
  if (slots.dims() != 1 || index.dims() != 1) {
    ctx->CtxFailure(__FILE__, __LINE__,
                    InvalidArgument("slots ", slots.shape().DebugString(), " and index ",
                                    index.shape().DebugString(), " must be vectors"));
    return false;
  }
  const int64_t u = slots.dim_size(0);
  auto at = index.flat<int64_t>();
  for (int64_t i = 0; i < index.dim_size(0); ++i) {
    if (at(i) < 0 || at(i) >= u) {
      ctx->CtxFailure(__FILE__, __LINE__, InvalidArgument("index[", i, "] = ", at(i), " is not in [0, ", u, ")"));
      return false;
    }
  }
  return true;
}

// rows float32 [N, dim]: row slots[index[i]] of the table's weights, zeros where it is -1
class GatherRows : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& slots = ctx->input(1);
    const Tensor& index = ctx->input(2);
    if (!CheckIndex(ctx, slots, index)) return;
    Var* var = nullptr;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &var));
    tensorflow::core::ScopedUnref unref(var);
    tensorflow::tf_shared_lock lock(*var->mu());
    OP_REQUIRES(ctx, var->is_initialized, FailedPrecondition("the table's weights are not initialized"));
    const Tensor& weights = *var->tensor();
    OP_REQUIRES(ctx, weights.dtype() == tensorflow::DT_FLOAT && weights.dims() == 2,
                InvalidArgument("the weights must be float32 [rows, dim], are ",
                                tensorflow::DataTypeString(weights.dtype()), " ", weights.shape().DebugString()));
    const int64_t rows = weights.dim_size(0), dim = weights.dim_size(1), n = index.dim_size(0);
    auto slot = slots.flat<int64_t>();
    for (int64_t u = 0; u < slots.dim_size(0); ++u) {
      OP_REQUIRES(ctx, slot(u) < rows, InvalidArgument("slots[", u, "] = ", slot(u), " is not below ", rows));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim}), &out));
    const float* w = weights.flat<float>().data();
    const int64_t* at = index.flat<int64_t>().data();
    const int64_t* row_of = slot.data();
    float* o = out->flat<float>().data();
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    tensorflow::Shard(pool->num_threads, pool->workers, n, std::max<int64_t>(1, dim), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t r = row_of[at[i]];
        if (r < 0) {
          std::fill(o + i * dim, o + (i + 1) * dim, 0.0f);
        } else {
          std::copy(w + r * dim, w + (r + 1) * dim, o + i * dim);
        }
      }
    });
  }
};

// The gradient of GatherRows as the rows' sparse gradient: values float32 [H, dim] and rows
// int64 [H], one entry for each slot that is not -1, in the slots' order; each value the sum
// of grad[i] over the keys i of that slot, added in key order from zero.
class GatherRowsGrad : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& slots = ctx->input(1);
    const Tensor& index = ctx->input(2);
    if (!CheckIndex(ctx, slots, index)) return;
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == index.dim_size(0),
                InvalidArgument("grad ", grad.shape().DebugString(), " must be [", index.dim_size(0), ", dim]"));
    const int64_t u = slots.dim_size(0), n = index.dim_size(0), dim = grad.dim_size(1);
    auto slot = slots.flat<int64_t>();
    std::vector<int64_t> place(u, -1);
    int64_t h = 0;
    for (int64_t k = 0; k < u; ++k) {
      if (slot(k) >= 0) place[k] = h++;
    }
    Tensor* values = nullptr;
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({h, dim}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({h}), &rows));
    auto row = rows->flat<int64_t>();
    for (int64_t k = 0; k < u; ++k) {
      if (place[k] >= 0) row(place[k]) = slot(k);
    }
    float* v = values->flat<float>().data();
    std::fill(v, v + h * dim, 0.0f);
    const float* g = grad.flat<float>().data();
    auto at = index.flat<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = place[at(i)];
      if (p < 0) continue;
      float* dst = v + p * dim;
      const float* src = g + i * dim;
      for (int64_t j = 0; j < dim; ++j) dst[j] += src[j];
    }
  }
};

}  // namespace

REGISTER_OP("RecpipeGatherRows")
    .Input("weights: resource")
    .Input("slots: int64")
    .Input("index: int64")
    .Output("rows: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      auto dim = c->UnknownDim();
      const auto* handle = c->input_handle_shapes_and_types(0);
      if (handle != nullptr && handle->size() == 1 && c->RankKnown((*handle)[0].shape)) {
        dim = c->Dim((*handle)[0].shape, 1);
      }
      c->set_output(0, c->Matrix(c->Dim(c->input(2), 0), dim));
      return absl::OkStatus();
    })
    .Doc("Row slots[index[i]] of an online table's weights for each key i, zeros where the slot is -1.");
REGISTER_KERNEL_BUILDER(Name("RecpipeGatherRows").Device(DEVICE_CPU), GatherRows);

REGISTER_OP("RecpipeGatherRowsGrad")
    .Input("grad: float")
    .Input("slots: int64")
    .Input("index: int64")
    .Output("values: float")
    .Output("rows: int64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grad;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("RecpipeGatherRows' gradient: one summed row a slot that is not -1, and its row.");
REGISTER_KERNEL_BUILDER(Name("RecpipeGatherRowsGrad").Device(DEVICE_CPU), GatherRowsGrad);

}  // namespace recpipe
