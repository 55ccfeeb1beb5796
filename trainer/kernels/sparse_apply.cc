// Row-wise optimizer updates of an embedding table, fused: one kernel reads a touched row's
// weights and slots once, updates them in place and writes them back, where the stock path
// takes a gather, the arithmetic and a scatter per slot (about a dozen ops per table a step).
// Rows are split over TensorFlow's intra-op thread pool. The formulas are those of
// trainer/sparse_optimizers.py (LazyAdam, SparseFtrl) and tf-keras' Adagrad, computed in the
// same order, so that both paths give the same floats.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "variables.h"

namespace recpipe {
namespace {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;

// The update's operands: ``count`` variables (the weights, then their slots), then int64 [n] row indices
// (distinct) and float32 [n, dim] gradient rows. Returns false (the context failed) where a
// shape or an index is out of bounds.
struct Rows {
  std::vector<float*> data;  // weights, then each slot: row-major [rows, dim]
  const int64_t* index = nullptr;
  const float* grad = nullptr;
  int64_t n = 0, dim = 0;
};

bool Prepare(OpKernelContext* ctx, LockedVariables* vars, int count, Rows* rows) {
  if (!vars->ok()) return false;
  const Tensor& index = ctx->input(count);
  const Tensor& grad = ctx->input(count + 1);
  int64_t nrows = -1;
  for (int i = 0; i < count; ++i) {
    Tensor* t = vars->Writable(i, tensorflow::DT_FLOAT, 2, i == 0 ? "var" : "a slot");
    if (t == nullptr) return false;
    if (i == 0) {
      nrows = t->dim_size(0);
      rows->dim = t->dim_size(1);
    } else if (t->dim_size(0) != nrows || t->dim_size(1) != rows->dim) {
      ctx->CtxFailure(__FILE__, __LINE__,
                      InvalidArgument("slot ", i, " is ", t->shape().DebugString(), ", its weights [",
                                      nrows, ",", rows->dim, "]"));
      return false;
    }
    rows->data.push_back(t->flat<float>().data());
  }
  if (index.dims() != 1 || grad.dims() != 2 || grad.dim_size(0) != index.dim_size(0) ||
      grad.dim_size(1) != rows->dim) {
    ctx->CtxFailure(__FILE__, __LINE__,
                    InvalidArgument("indices ", index.shape().DebugString(), " and grad ",
                                    grad.shape().DebugString(), " must be [n] and [n, ", rows->dim, "]"));
    return false;
  }
  rows->n = index.dim_size(0);
  rows->index = index.flat<int64_t>().data();
  rows->grad = grad.flat<float>().data();
  for (int64_t i = 0; i < rows->n; ++i) {
    if (rows->index[i] < 0 || rows->index[i] >= nrows) {
      ctx->CtxFailure(__FILE__, __LINE__,
                      InvalidArgument("indices[", i, "] = ", rows->index[i], " is not in [0, ", nrows, ")"));
      return false;
    }
  }
  return true;
}

float Scalar(OpKernelContext* ctx, int i) { return ctx->input(i).scalar<float>()(); }

// Runs update(row index into the variables, gradient row, dim) over the rows, split over the
// intra-op pool (the rows are distinct, so no two threads write one row).
template <typename Update>
void ForRows(OpKernelContext* ctx, const Rows& rows, int flops_per_value, Update update) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
  const int64_t cost = std::max<int64_t>(1, rows.dim * flops_per_value);
  tensorflow::Shard(pool->num_threads, pool->workers, rows.n, cost, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) update(rows.index[i] * rows.dim, rows.grad + i * rows.dim, rows.dim);
  });
}

Status RowShape(InferenceContext* c, int count) {
  // the variables' shapes are checked by the kernel; the op has no outputs
  tensorflow::shape_inference::ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(count), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(count + 1), 2, &unused));
  return absl::OkStatus();
}

// LazyAdam (TF Addons; EasyRec's lazy_adam_optimizer) on the rows in the batch:
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;  w <- w - alpha m / (sqrt(v) + eps)
// with alpha = lr sqrt(1 - b2^t) / (1 - b1^t) computed by the caller.
class SparseApplyAdam : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    LockedVariables vars(ctx, LockedVariables::First(3));
    Rows rows;
    if (!Prepare(ctx, &vars, 3, &rows)) return;
    const float alpha = Scalar(ctx, 5), b1 = Scalar(ctx, 6), b2 = Scalar(ctx, 7), eps = Scalar(ctx, 8);
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    float *w = rows.data[0], *m = rows.data[1], *v = rows.data[2];
    ForRows(ctx, rows, 12, [&](int64_t at, const float* g, int64_t dim) {
      for (int64_t j = 0; j < dim; ++j) {
        const float mj = b1 * m[at + j] + c1 * g[j];
        const float vj = b2 * v[at + j] + c2 * (g[j] * g[j]);
        m[at + j] = mj;
        v[at + j] = vj;
        w[at + j] -= alpha * mj / (std::sqrt(vj) + eps);
      }
    });
  }
};

// tf-keras' Adagrad on the rows in the batch: a <- a + g^2;  w <- w + (-lr g) / sqrt(a + eps)
class SparseApplyAdagrad : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    LockedVariables vars(ctx, LockedVariables::First(2));
    Rows rows;
    if (!Prepare(ctx, &vars, 2, &rows)) return;
    const float neg_lr = -Scalar(ctx, 4), eps = Scalar(ctx, 5);
    float *w = rows.data[0], *a = rows.data[1];
    ForRows(ctx, rows, 8, [&](int64_t at, const float* g, int64_t dim) {
      for (int64_t j = 0; j < dim; ++j) {
        const float aj = a[at + j] + g[j] * g[j];
        a[at + j] = aj;
        w[at + j] += neg_lr * g[j] / std::sqrt(aj + eps);
      }
    });
  }
};

// FTRL-Proximal (McMahan et al. 2013, algorithm 1, learning_rate_power p in place of -1/2)
// on the rows in the batch, as trainer/sparse_optimizers.py's SparseFtrl:
//   a' = a + g^2;  z <- z + g + 2 l2s w - (a'^-p - a^-p) / lr w;  a <- a'
//   w <- (clip(z, -l1, l1) - z) / (a'^-p / lr + 2 l2)
class SparseApplyFtrl : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    LockedVariables vars(ctx, LockedVariables::First(3));
    Rows rows;
    if (!Prepare(ctx, &vars, 3, &rows)) return;
    const float lr = Scalar(ctx, 5), l1 = Scalar(ctx, 6), l2 = Scalar(ctx, 7), l2s = Scalar(ctx, 8),
                p = Scalar(ctx, 9);
    float *w = rows.data[0], *a = rows.data[1], *z = rows.data[2];
    ForRows(ctx, rows, 40, [&](int64_t at, const float* g, int64_t dim) {
      for (int64_t j = 0; j < dim; ++j) {
        const float wj = w[at + j], aj = a[at + j];
        const float new_a = aj + g[j] * g[j];
        const float pow_new = std::pow(new_a, -p), pow_old = std::pow(aj, -p);
        const float zj = z[at + j] + (g[j] + 2.0f * l2s * wj - (pow_new - pow_old) / lr * wj);
        const float quadratic = pow_new / lr + 2.0f * l2;
        z[at + j] = zj;
        a[at + j] = new_a;
        w[at + j] = (std::min(std::max(zj, -l1), l1) - zj) / quadratic;
      }
    });
  }
};

}  // namespace

REGISTER_OP("RecpipeSparseApplyAdam")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("indices: int64")
    .Input("grad: float")
    .Input("alpha: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .SetShapeFn([](InferenceContext* c) { return RowShape(c, 3); })
    .Doc("LazyAdam on the rows `indices` (distinct) of var and its slots m, v, in place.");
REGISTER_KERNEL_BUILDER(Name("RecpipeSparseApplyAdam").Device(DEVICE_CPU), SparseApplyAdam);

REGISTER_OP("RecpipeSparseApplyAdagrad")
    .Input("var: resource")
    .Input("accumulator: resource")
    .Input("indices: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("epsilon: float")
    .SetShapeFn([](InferenceContext* c) { return RowShape(c, 2); })
    .Doc("tf-keras' Adagrad on the rows `indices` (distinct) of var and its accumulator, in place.");
REGISTER_KERNEL_BUILDER(Name("RecpipeSparseApplyAdagrad").Device(DEVICE_CPU), SparseApplyAdagrad);

REGISTER_OP("RecpipeSparseApplyFtrl")
    .Input("var: resource")
    .Input("accumulator: resource")
    .Input("linear: resource")
    .Input("indices: int64")
    .Input("grad: float")
    .Input("lr: float")
    .Input("l1: float")
    .Input("l2: float")
    .Input("l2_shrinkage: float")
    .Input("lr_power: float")
    .SetShapeFn([](InferenceContext* c) { return RowShape(c, 3); })
    .Doc("FTRL-Proximal on the rows `indices` (distinct) of var and its slots, in place.");
REGISTER_KERNEL_BUILDER(Name("RecpipeSparseApplyFtrl").Device(DEVICE_CPU), SparseApplyFtrl);

}  // namespace recpipe
