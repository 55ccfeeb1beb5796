// An online table's admission for one step (trainer/online/admit.py: StepAdmission.admit) in one
// kernel, where the stock path takes about 330 ops a table, nearly half of them in the branches
// of its conditions (eviction by steps, growth, eviction of the least recently used rows, the
// sketch's widening), which a traced step carries and Grappler optimises whether or not a step
// takes them. The count-min sketch is DeepRec's CounterFilter (Cormode and Muthukrishnan 2005).
// The kernel computes the stock ops' values in their order
// (tests/trainer/test_fused_against_stock.py).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "variables.h"

namespace recpipe {
namespace {

namespace tf = ::tensorflow;
using tf::errors::InvalidArgument;

constexpr int kDepth = 4;   // trainer.online.admission.SKETCH_DEPTH
constexpr int kShift = 11;  // trainer.online.admission.SKETCH_SHIFT
constexpr int kStats = 5;   // admitted, evicted, refused, lookups, filtered (row_io.STATS)

// The counter positions of `key` in a flat sketch of `width` counters a hash (CountMinSketch.index).
inline void SketchIndex(int64_t key, int64_t width, int64_t* out) {
  for (int d = 0; d < kDepth; ++d) {
    int64_t h = (key >> (kShift * d)) % width;
    if (h < 0) h += width;  // floormod
    out[d] = h + d * width;
  }
}

// The id -> row map (a MutableHashTable of int64 -> int64) at input `i`; the caller unrefs it.
tf::Status MapAt(tf::OpKernelContext* ctx, int i, tf::lookup::LookupInterface** map) {
  TF_RETURN_IF_ERROR(tf::LookupResource(ctx, tf::HandleFromInput(ctx, i), map));
  if ((*map)->key_dtype() != tf::DT_INT64 || (*map)->value_dtype() != tf::DT_INT64) {
    (*map)->Unref();
    return InvalidArgument("the id -> row map must map int64 to int64");
  }
  return absl::OkStatus();
}

bool Vector(tf::OpKernelContext* ctx, int i, const char* what, int64_t size = -1) {
  const tf::Tensor& t = ctx->input(i);
  if (t.dims() != 1 || (size >= 0 && t.dim_size(0) != size)) {
    ctx->CtxFailure(__FILE__, __LINE__,
                    InvalidArgument(what, " must be a vector", size >= 0 ? " of the keys' length" : "", ", is ",
                                    t.shape().DebugString()));
    return false;
  }
  return true;
}

// Rows of the same table: every state variable as long as the ids'.
bool SameRows(tf::OpKernelContext* ctx, const std::vector<tf::Tensor*>& vars, int64_t rows) {
  for (const tf::Tensor* t : vars) {
    if (t->dim_size(0) != rows) {
      ctx->CtxFailure(__FILE__, __LINE__,
                      InvalidArgument("the rows' state has ", t->dim_size(0), " and ", rows, " rows"));
      return false;
    }
  }
  return true;
}

// The rows' state of one table, writable in place: the pointers follow a growth.
struct State {
  tf::Tensor *ids, *freqs, *versions, *days, *free, *free_top, *tags;
  int64_t rows = 0;
  int64_t *id, *f, *v, *d, *stack, *tag;

  void Bind() {
    rows = ids->dim_size(0);
    id = ids->flat<int64_t>().data();
    f = freqs->flat<int64_t>().data();
    v = versions->flat<int64_t>().data();
    d = days->flat<int64_t>().data();
    stack = free->flat<int64_t>().data();
    tag = tags ? tags->flat<int64_t>().data() : nullptr;
  }
  int64_t& top() { return free_top->scalar<int64_t>()(); }
};

// `t` (int64 [n]) extended to `rows` entries at `fill`, in a new buffer.
tf::Status Extend(tf::OpKernelContext* ctx, tf::Tensor* t, int64_t rows, int64_t fill) {
  tf::Tensor grown;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(t->dtype(), tf::TensorShape({rows}), &grown));
  CopyAndFill<int64_t>(*t, &grown, fill);
  *t = grown;
  return absl::OkStatus();
}

// An online table's whole training admission for a step's distinct ids (EmbeddingVariable.admit,
// in the stock ops' order): find their rows; count, version and day the rows found; with
// steps_to_live, evict the stale rows every steps_to_live / 8 steps; count the others (their
// sightings plus the sketch's estimate); when fewer rows are free than ids are ready, grow the
// rows' state (up to max_rows) or evict the least recently used rows not used in this step; give
// the first ready ids rows from the top of the free stack; raise the sketch's counters of the ids
// left out to their counts and widen it when half full (up to sketch_most counters a hash; 0: a
// fixed width); add the step's statistics per table of the group.
// Resources: map, ev_keys, freqs, versions, days, free, free_top, sketch, sketch_used, stats, then
// ev_tables in a group (N = 1). Then keys, occurrences, members (int64 [U]; members empty alone),
// step, day. Outputs: rows (int64 [U], -1 for ids left without one), targets (int64 [A], the rows
// given), new_keys (int64 [A], their ids), cleared (int64 [C], the rows evicted, whose weights the
// caller clears). The weights and optimizer slots are the caller's (their growth, clearing and
// initial values).
struct AdmitAttrs {
  int64_t filter_freq, steps_to_live, max_rows, sketch_most;
  std::vector<int64_t> tags;
  int grouped;
};

// One run of the kernel: its context, map and the variables' tensors, apart from the kernel,
// whose Compute may run for two steps at once.
class AdmitStep {
 public:
  AdmitStep(tf::OpKernelContext* ctx, const AdmitAttrs& a)
      : filter_freq_(a.filter_freq),
        steps_to_live_(a.steps_to_live),
        max_rows_(a.max_rows),
        sketch_most_(a.sketch_most),
        tags_(a.tags),
        grouped_(a.grouped),
        ctx_(ctx) {}

  void Run() {
    tf::OpKernelContext* ctx = ctx_;
    const int base = 10 + grouped_;
    members_ = tags_.size();
    if (!Vector(ctx, base, "keys")) return;
    const tf::Tensor& keys = ctx->input(base);
    const int64_t n = keys.dim_size(0);
    if (!Vector(ctx, base + 1, "occurrences", n) || !Vector(ctx, base + 2, "members", grouped_ ? n : 0)) return;
    const int64_t* key = keys.flat<int64_t>().data();
    const int64_t* occ = ctx->input(base + 1).flat<int64_t>().data();
    const int64_t* member = grouped_ ? ctx->input(base + 2).flat<int64_t>().data() : nullptr;
    const int64_t step = ctx->input(base + 3).scalar<int64_t>()();
    const int64_t day = ctx->input(base + 4).scalar<int64_t>()();
    for (int64_t i = 0; grouped_ && i < n; ++i)
      OP_REQUIRES(ctx, member[i] >= 0 && member[i] < members_,
                  InvalidArgument("members[", i, "] = ", member[i], " is not in [0, ", members_, ")"));
    auto member_of = [&](int64_t i) { return grouped_ ? member[i] : 0; };

    OP_REQUIRES_OK(ctx, MapAt(ctx, 0, &map_));
    tf::core::ScopedUnref unref(map_);
    tf::Tensor* rows_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({n}), &rows_out));
    tf::Tensor none(tf::DT_INT64, tf::TensorShape({}));
    none.scalar<int64_t>()() = -1;
    OP_REQUIRES_OK(ctx, map_->Find(ctx, keys, rows_out, none));
    int64_t* row = rows_out->flat<int64_t>().data();

    std::vector<int> inputs = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    if (grouped_) inputs.push_back(10);
    LockedVariables vars(ctx, inputs);
    if (!vars.ok() || !Bind(&vars)) return;
    State& s = state_;

    // the ids with a row: counted, versioned, dated
    std::vector<int64_t> miss;
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, row[i] < s.rows, InvalidArgument("the map gives id ", key[i], " row ", row[i], " of ", s.rows));
      if (row[i] < 0) miss.push_back(i);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (row[i] < 0) continue;
      s.f[row[i]] += occ[i];
      s.v[row[i]] = step;
      s.d[row[i]] = day;
    }
    int64_t* stat = stats_->flat<int64_t>().data();
    std::vector<int64_t> cleared;
    if (steps_to_live_ > 0 && step % std::max<int64_t>(1, steps_to_live_ / 8) == 0) {
      std::vector<int64_t> stale;
      for (int64_t r = 0; r < s.rows; ++r)
        if (s.id[r] >= 0 && s.v[r] < step - steps_to_live_) stale.push_back(r);
      if (!Evict(stale, stat)) return;
      cleared = stale;
    }

    // the others' counts: their sightings, plus the sketch's estimate
    const int64_t m = miss.size();
    std::vector<float> count(m);
    std::vector<int64_t> at;
    const int64_t width = sketch_->dim_size(0) / kDepth;
    if (filter_freq_ > 1) {
      OP_REQUIRES(ctx, width > 0, InvalidArgument("the sketch has no counters"));
      const float* sketch = sketch_->flat<float>().data();
      at.resize(m * kDepth);
      for (int64_t j = 0; j < m; ++j) {
        SketchIndex(key[miss[j]], width, &at[j * kDepth]);
        float estimate = sketch[at[j * kDepth]];
        for (int k = 1; k < kDepth; ++k) estimate = std::min(estimate, sketch[at[j * kDepth + k]]);
        count[j] = static_cast<float>(occ[miss[j]]) + estimate;
      }
    } else {
      for (int64_t j = 0; j < m; ++j) count[j] = static_cast<float>(occ[miss[j]]);
    }
    int64_t ready = 0;
    for (int64_t j = 0; j < m; ++j) ready += Ready(count[j]);

    // room for them: the state grows, or at max_rows the least recently used rows go
    const int64_t cap = s.rows;
    const int64_t short_by = ready - s.top();
    if (short_by > 0 && cap < max_rows_) {
      if (!Grow(std::min(std::max(2 * cap, cap + short_by), max_rows_))) return;
    }
    const int64_t need = ready - s.top();
    if (need > 0) {
      std::vector<int64_t> victims = LeastRecentlyUsed(step, need);
      if (!Evict(victims, stat)) return;
      cleared.insert(cleared.end(), victims.begin(), victims.end());
    }

    // the first ids ready take the rows on top of the free stack, lowest first
    const int64_t top = s.top();
    const int64_t given = std::min(ready, top);
    tf::Tensor *targets = nullptr, *new_keys = nullptr, *cleared_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({given}), &targets));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({given}), &new_keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, tf::TensorShape({static_cast<int64_t>(cleared.size())}), &cleared_out));
    std::copy(cleared.begin(), cleared.end(), cleared_out->flat<int64_t>().data());
    int64_t* target = targets->flat<int64_t>().data();
    int64_t* new_key = new_keys->flat<int64_t>().data();
    std::vector<char> admitted(m, 0);
    for (int64_t j = 0, a = 0; j < m && a < given; ++j) {
      if (!Ready(count[j])) continue;
      admitted[j] = 1;
      const int64_t r = s.stack[top - 1 - a], i = miss[j];
      OP_REQUIRES(ctx, r >= 0 && r < s.rows, InvalidArgument("free row ", r, " is not a row"));
      target[a] = r;
      new_key[a] = key[i];
      row[i] = r;
      s.id[r] = key[i];
      s.f[r] = static_cast<int64_t>(count[j]);
      s.v[r] = step;
      s.d[r] = day;
      if (grouped_) s.tag[r] = tags_[member[i]];
      ++a;
    }
    s.top() = top - given;
    OP_REQUIRES_OK(ctx, map_->Insert(ctx, *new_keys, *targets));

    // the ids left without a row keep their counts (conservative update)
    if (filter_freq_ > 1) {
      float* sketch = sketch_->flat<float>().data();
      int64_t started = 0;  // counted before any update: a counter two ids share counts twice
      for (int64_t j = 0; j < m; ++j) {
        const float c = admitted[j] ? 0.0f : count[j];
        for (int k = 0; k < kDepth; ++k) started += sketch[at[j * kDepth + k]] == 0.0f && c > 0.0f;
      }
      for (int64_t j = 0; j < m; ++j) {
        const float c = admitted[j] ? 0.0f : count[j];
        for (int k = 0; k < kDepth; ++k) sketch[at[j * kDepth + k]] = std::max(sketch[at[j * kDepth + k]], c);
      }
      used_->scalar<int64_t>()() += started;
      if (sketch_most_ > 0 && !Widen()) return;
    }

    for (int64_t i = 0; i < n; ++i) stat[member_of(i) * kStats + 3] += occ[i];
    for (int64_t j = 0; j < m; ++j) {
      const int64_t t = member_of(miss[j]) * kStats;
      if (admitted[j]) {
        stat[t] += 1;
        continue;
      }
      stat[t + 2] += Ready(count[j]);
      stat[t + 4] += occ[miss[j]];
    }
  }

 private:
  bool Ready(float count) const { return filter_freq_ <= 1 || count >= static_cast<float>(filter_freq_); }

  bool Bind(LockedVariables* vars) {
    State& s = state_;
    s.ids = vars->Writable(0, tf::DT_INT64, 1, "ev_keys");
    s.freqs = s.ids ? vars->Writable(1, tf::DT_INT64, 1, "ev_freqs") : nullptr;
    s.versions = s.freqs ? vars->Writable(2, tf::DT_INT64, 1, "ev_versions") : nullptr;
    s.days = s.versions ? vars->Writable(3, tf::DT_INT64, 1, "ev_days") : nullptr;
    s.free = s.days ? vars->Writable(4, tf::DT_INT64, 1, "ev_free_rows") : nullptr;
    s.free_top = s.free ? vars->Writable(5, tf::DT_INT64, 0, "ev_free_top") : nullptr;
    sketch_ = s.free_top ? vars->Writable(6, tf::DT_FLOAT, 1, "ev_filter_counts") : nullptr;
    used_ = sketch_ ? vars->Writable(7, tf::DT_INT64, 0, "ev_filter_used") : nullptr;
    stats_ = used_ ? vars->Writable(8, tf::DT_INT64, 1, "ev_stats") : nullptr;
    if (stats_ == nullptr) return false;
    s.tags = nullptr;
    std::vector<tf::Tensor*> rows = {s.freqs, s.versions, s.days, s.free};
    if (grouped_) {
      s.tags = vars->Writable(9, tf::DT_INT64, 1, "ev_tables");
      if (s.tags == nullptr) return false;
      rows.push_back(s.tags);
    }
    if (!SameRows(ctx_, rows, s.ids->dim_size(0))) return false;
    if (stats_->dim_size(0) != kStats * members_) {
      ctx_->CtxFailure(__FILE__, __LINE__,
                       InvalidArgument("ev_stats has ", stats_->dim_size(0), " counts, not ", kStats * members_));
      return false;
    }
    s.Bind();
    if (s.top() < 0 || s.top() > s.rows) {
      ctx_->CtxFailure(__FILE__, __LINE__, InvalidArgument("ev_free_top ", s.top(), " is not in [0, ", s.rows, "]"));
      return false;
    }
    return true;
  }

  // Free `rows`: count them per table, drop their ids from the map, clear their state, push
  // them on the free stack (EmbeddingVariable._evict_state).
  bool Evict(const std::vector<int64_t>& rows, int64_t* stat) {
    if (rows.empty()) return true;
    State& s = state_;
    const int64_t k = rows.size();
    tf::Tensor gone(tf::DT_INT64, tf::TensorShape({k}));
    int64_t* g = gone.flat<int64_t>().data();
    for (int64_t i = 0; i < k; ++i) {
      const int64_t r = rows[i];
      int64_t t = 0;
      if (grouped_) {  // the first tag that matches, as the stock ops' argmax
        t = std::find(tags_.begin(), tags_.end(), s.tag[r]) - tags_.begin();
        if (t == members_) t = 0;
      }
      stat[t * kStats + 1] += 1;
      g[i] = s.id[r];
    }
    tf::Status status = map_->Remove(ctx_, gone);
    if (!status.ok()) {
      ctx_->CtxFailure(__FILE__, __LINE__, status);
      return false;
    }
    int64_t& top = s.top();
    for (int64_t i = 0; i < k; ++i) {
      const int64_t r = rows[i];
      s.id[r] = -1;
      s.f[r] = s.v[r] = s.d[r] = 0;
      s.stack[top + i] = rows[k - 1 - i];
    }
    top += k;
    return true;
  }

  // The state's variables extended to `rows` (ids free, counts 0), the new rows pushed on the
  // free stack, the lowest on top (EmbeddingVariable._grow_state).
  bool Grow(int64_t rows) {
    State& s = state_;
    const int64_t cap = s.rows, top = s.top();
    tf::Status status = Extend(ctx_, s.ids, rows, -1);
    for (tf::Tensor* t : {s.freqs, s.versions, s.days, s.free})
      if (status.ok()) status = Extend(ctx_, t, rows, 0);
    if (status.ok() && grouped_) status = Extend(ctx_, s.tags, rows, 0);
    if (!status.ok()) {
      ctx_->CtxFailure(__FILE__, __LINE__, status);
      return false;
    }
    s.Bind();
    for (int64_t i = 0; i < rows - cap; ++i) s.stack[top + i] = rows - 1 - i;
    s.top() = top + rows - cap;
    return true;
  }

  // The max(need, rows / 64) least recently looked-up rows not used at `step`, oldest first,
  // ties by row (eviction.least_recently_used: top_k keeps the lower index first).
  std::vector<int64_t> LeastRecentlyUsed(int64_t step, int64_t need) {
    State& s = state_;
    std::vector<int64_t> old;
    for (int64_t r = 0; r < s.rows; ++r)
      if (s.id[r] >= 0 && s.v[r] < step) old.push_back(r);
    const int64_t k = std::min<int64_t>(std::max(need, s.rows / 64), old.size());
    auto older = [&](int64_t a, int64_t b) { return s.v[a] < s.v[b] || (s.v[a] == s.v[b] && a < b); };
    std::partial_sort(old.begin(), old.begin() + k, old.end(), older);
    old.resize(k);
    return old;
  }

  // With at least half its counters in use (sketch_used, an upper bound), the sketch's counters
  // recounted and its width doubled until at most half are, up to sketch_most
  // (EmbeddingVariable._widen_sketch); each hash's counts keep their positions.
  bool Widen() {
    const int64_t width = sketch_->dim_size(0) / kDepth;
    int64_t& used = used_->scalar<int64_t>()();
    if (!(2 * used > kDepth * width && width < sketch_most_)) return true;
    const float* old = sketch_->flat<float>().data();
    used = std::count_if(old, old + kDepth * width, [](float c) { return c != 0.0f; });
    int64_t target = width;
    while (2 * used > kDepth * target && 2 * target <= sketch_most_) target *= 2;
    if (target <= width) return true;
    tf::Tensor wider;
    tf::Status status = ctx_->allocate_temp(tf::DT_FLOAT, tf::TensorShape({kDepth * target}), &wider);
    if (!status.ok()) {
      ctx_->CtxFailure(__FILE__, __LINE__, status);
      return false;
    }
    float* out = wider.flat<float>().data();
    for (int k = 0; k < kDepth; ++k) {
      std::copy_n(old + k * width, width, out + k * target);
      std::fill(out + k * target + width, out + (k + 1) * target, 0.0f);
    }
    *sketch_ = wider;
    return true;
  }

  const int64_t filter_freq_, steps_to_live_, max_rows_, sketch_most_;
  const std::vector<int64_t>& tags_;
  const int grouped_;
  tf::OpKernelContext* ctx_;
  tf::lookup::LookupInterface* map_ = nullptr;
  State state_{};
  tf::Tensor *sketch_ = nullptr, *used_ = nullptr, *stats_ = nullptr;
  int64_t members_ = 1;
};

class Admit : public tf::OpKernel {
 public:
  explicit Admit(tf::OpKernelConstruction* ctx) : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("filter_freq", &attrs_.filter_freq));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tags", &attrs_.tags));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &attrs_.grouped));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("steps_to_live", &attrs_.steps_to_live));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_rows", &attrs_.max_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sketch_most", &attrs_.sketch_most));
    OP_REQUIRES(ctx, !attrs_.tags.empty(), InvalidArgument("tags must name at least one table"));
  }

  void Compute(tf::OpKernelContext* ctx) override { AdmitStep(ctx, attrs_).Run(); }

 private:
  AdmitAttrs attrs_;
};

tf::Status AdmitShape(tf::shape_inference::InferenceContext* c) {
  int grouped = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &grouped));
  c->set_output(0, c->input(10 + grouped));
  for (int i = 1; i < 4; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("RecpipeAdmit")
    .Input("map: resource")
    .Input("ids: resource")
    .Input("freqs: resource")
    .Input("versions: resource")
    .Input("days: resource")
    .Input("free: resource")
    .Input("free_top: resource")
    .Input("sketch: resource")
    .Input("sketch_used: resource")
    .Input("stats: resource")
    .Input("row_tags: N * resource")
    .Input("keys: int64")
    .Input("occurrences: int64")
    .Input("members: int64")
    .Input("step: int64")
    .Input("day: int64")
    .Output("rows: int64")
    .Output("targets: int64")
    .Output("new_keys: int64")
    .Output("cleared: int64")
    .Attr("N: int >= 0 = 0")
    .Attr("filter_freq: int")
    .Attr("tags: list(int)")
    .Attr("steps_to_live: int")
    .Attr("max_rows: int")
    .Attr("sketch_most: int")
    .SetIsStateful()
    .SetShapeFn(AdmitShape)
    .Doc("An online table's admission for one step's distinct ids: rows found, counted, evicted, grown, given.");
REGISTER_KERNEL_BUILDER(Name("RecpipeAdmit").Device(tf::DEVICE_CPU), Admit);

}  // namespace recpipe
