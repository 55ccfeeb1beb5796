// An online table's growth in one kernel: every variable with one entry per row (the rows'
// state, weights and optimizer slots) extended in place to `rows` rows, the new rows at each
// variable's fill value. The stock path pads and assigns each variable (a pad, an assignment
// and their shape ops apiece, in a branch the traced step carries); this kernel is one op.
// Variables are extended one at a time, so the transient is one variable's old and new buffer.
#include <algorithm>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "variables.h"

namespace recpipe {
namespace {

namespace tf = ::tensorflow;

class GrowRows : public tf::OpKernel {
 public:
  explicit GrowRows(tf::OpKernelConstruction* ctx) : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fills", &fills_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int n = ctx->num_inputs() - 1;
    OP_REQUIRES(ctx, static_cast<int>(fills_.size()) == n,
                tf::errors::InvalidArgument(n, " variables but ", fills_.size(), " fill values"));
    const tf::Tensor& rows_in = ctx->input(n);
    OP_REQUIRES(ctx, rows_in.dims() == 0, tf::errors::InvalidArgument("rows must be a scalar"));
    const int64_t rows = rows_in.scalar<int64_t>()();
    for (int i = 0; i < n; ++i) {
      tf::Var* var = nullptr;
      OP_REQUIRES_OK(ctx, tf::LookupResource(ctx, tf::HandleFromInput(ctx, i), &var));
      tf::core::ScopedUnref unref(var);
      tf::mutex_lock lock(*var->mu());
      OP_REQUIRES(ctx, var->is_initialized, tf::errors::FailedPrecondition("variable ", i, " is not initialized"));
      const tf::Tensor old = *var->tensor();
      OP_REQUIRES(ctx, old.dims() >= 1, tf::errors::InvalidArgument("variable ", i, " has no rows: ", old.shape().DebugString()));
      if (old.dim_size(0) >= rows) continue;
      tf::TensorShape shape = old.shape();
      shape.set_dim(0, rows);
      tf::Tensor grown;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(old.dtype(), shape, &grown));
      switch (old.dtype()) {
        case tf::DT_FLOAT:
          CopyAndFill<float>(old, &grown, fills_[i]);
          break;
        case tf::DT_INT64:
          CopyAndFill<int64_t>(old, &grown, fills_[i]);
          break;
        case tf::DT_INT32:
          CopyAndFill<int32_t>(old, &grown, fills_[i]);
          break;
        default:
          ctx->CtxFailure(__FILE__, __LINE__,
                          tf::errors::InvalidArgument("variable ", i, ": ", tf::DataTypeString(old.dtype()),
                                          " rows are not supported (float32, int64, int32)"));
          return;
      }
      *var->tensor() = grown;
    }
  }

 private:
  std::vector<float> fills_;
};

}  // namespace

REGISTER_OP("RecpipeGrowRows")
    .Input("variables: N * resource")
    .Input("rows: int64")
    .Attr("N: int >= 1")
    .Attr("fills: list(float)")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::NoOutputs)
    .Doc("Extend each variable in place to `rows` rows (none shorter), new rows at its fill value.");
REGISTER_KERNEL_BUILDER(Name("RecpipeGrowRows").Device(tf::DEVICE_CPU), GrowRows);

}  // namespace recpipe
