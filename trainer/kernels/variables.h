// The resource variables a kernel writes in place: looked up from its inputs, locked in address
// order for the kernel's run (two kernels over overlapping variables never wait on each other),
// and each buffer made the variable's own before it is written, as TensorFlow's scatter
// kernels do, so that a value read earlier in the step keeps what it read.
#ifndef RECPIPE_KERNELS_VARIABLES_H_
#define RECPIPE_KERNELS_VARIABLES_H_

#include <algorithm>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace recpipe {

class LockedVariables {
 public:
  // The variables at ctx's inputs `inputs`, in that order.
  LockedVariables(tensorflow::OpKernelContext* ctx, const std::vector<int>& inputs) : ctx_(ctx) {
    for (int i : inputs) {
      tensorflow::Var* var = nullptr;
      tensorflow::Status s = tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, i), &var);
      if (!s.ok()) {
        ctx->CtxFailure(__FILE__, __LINE__, s);
        return;
      }
      vars_.push_back(var);
    }
    std::vector<tensorflow::Var*> order(vars_);
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    for (tensorflow::Var* var : order) {
      var->mu()->lock();
      locked_.push_back(var);
    }
  }

  // The variables [0, count) of ctx's inputs.
  static std::vector<int> First(int count) {
    std::vector<int> inputs(count);
    for (int i = 0; i < count; ++i) inputs[i] = i;
    return inputs;
  }

  ~LockedVariables() {
    for (tensorflow::Var* var : locked_) var->mu()->unlock();
    for (tensorflow::Var* var : vars_) var->Unref();
  }

  LockedVariables(const LockedVariables&) = delete;
  LockedVariables& operator=(const LockedVariables&) = delete;

  bool ok() const { return ctx_->status().ok(); }

  // The k-th variable's value, to read (locked, not copied); null as for Writable.
  const tensorflow::Tensor* Readable(int k, tensorflow::DataType dtype, int rank, const char* what) {
    return Checked(k, dtype, rank, what);
  }

  // The k-th variable's value, writable in place, when it is `dtype` of rank `rank`; null
  // (the context failed, naming the variable as `what`) otherwise.
  tensorflow::Tensor* Writable(int k, tensorflow::DataType dtype, int rank, const char* what) {
    tensorflow::Tensor* t = Checked(k, dtype, rank, what);
    if (t == nullptr) return nullptr;
    tensorflow::Var* var = vars_[k];
    var->copy_on_read_mode.store(true);
    if (!t->RefCountIsOne()) {
      tensorflow::Tensor own;
      tensorflow::Status s = ctx_->allocate_temp(t->dtype(), t->shape(), &own);
      if (!s.ok()) {
        ctx_->CtxFailure(__FILE__, __LINE__, s);
        return nullptr;
      }
      if (t->TotalBytes() > 0) std::memcpy(own.data(), t->data(), t->TotalBytes());
      *t = own;
    }
    return t;
  }

 private:
  tensorflow::Tensor* Checked(int k, tensorflow::DataType dtype, int rank, const char* what) {
    tensorflow::Var* var = vars_[k];
    if (!var->is_initialized) {
      ctx_->CtxFailure(__FILE__, __LINE__, tensorflow::errors::FailedPrecondition(what, " is not initialized"));
      return nullptr;
    }
    tensorflow::Tensor* t = var->tensor();
    if (t->dtype() != dtype || t->dims() != rank) {
      ctx_->CtxFailure(__FILE__, __LINE__,
                       tensorflow::errors::InvalidArgument(
                           what, " must be ", tensorflow::DataTypeString(dtype), " of rank ", rank, ", is ",
                           tensorflow::DataTypeString(t->dtype()), " ", t->shape().DebugString()));
      return nullptr;
    }
    return t;
  }

  tensorflow::OpKernelContext* ctx_;
  std::vector<tensorflow::Var*> vars_;
  std::vector<tensorflow::Var*> locked_;
};

// A variable's growth: `old`'s entries (dtype T), then `fill` up to `grown`'s size (allocated,
// of old's dtype and as many or more entries).
template <typename T>
void CopyAndFill(const tensorflow::Tensor& old, tensorflow::Tensor* grown, double fill) {
  const int64_t kept = old.NumElements();
  T* out = grown->flat<T>().data();
  if (kept > 0) std::memcpy(out, old.flat<T>().data(), kept * sizeof(T));
  std::fill(out + kept, out + grown->NumElements(), static_cast<T>(fill));
}

}  // namespace recpipe

#endif  // RECPIPE_KERNELS_VARIABLES_H_
