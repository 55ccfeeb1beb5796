// An online table's admission (trainer/online/table.py, EmbeddingVariable.admit) in two kernels,
// where the stock path takes about sixty ops a table and step:
// - RecpipeAdmitFind maps a step's distinct ids to their rows, updates the rows found (count,
//   version, day) and counts the others: their sightings plus the count-min sketch's estimate
//   (DeepRec's CounterFilter; Cormode and Muthukrishnan 2005);
// - RecpipeAdmitRows gives the ids whose count reaches filter_freq rows from the free stack,
//   records them (the id -> row map, the rows' state), raises the sketch's counters of the ids
//   left without a row to their counts (conservative update) and adds the step's statistics.
// Between the two, stock ops evict stale rows and, when too few rows are free, grow the table or
// evict the least recently used rows: branches a step seldom takes. The kernels compute the stock
// ops' values in the same order (tests/trainer/test_fused_against_stock.py).
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

// Inputs: map, freqs, versions, days, sketch (resources); keys, occurrences (int64 [U]), step,
// day (int64 []). Outputs: slots (int64 [U], -1 without a row), miss (int64 [M], the positions of
// the ids without a row), count (float32 [M], their sightings plus the sketch's estimate with
// filter_freq > 1), ready (int64 [], how many counts reach filter_freq).
class AdmitFind : public tf::OpKernel {
 public:
  explicit AdmitFind(tf::OpKernelConstruction* ctx) : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("filter_freq", &filter_freq_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    if (!Vector(ctx, 5, "keys")) return;
    const int64_t n = ctx->input(5).dim_size(0);
    if (!Vector(ctx, 6, "occurrences", n)) return;
    const tf::Tensor& keys = ctx->input(5);
    const int64_t* key = keys.flat<int64_t>().data();
    const int64_t* occ = ctx->input(6).flat<int64_t>().data();
    const int64_t step = ctx->input(7).scalar<int64_t>()(), day = ctx->input(8).scalar<int64_t>()();

    tf::lookup::LookupInterface* map = nullptr;
    OP_REQUIRES_OK(ctx, MapAt(ctx, 0, &map));
    tf::core::ScopedUnref unref(map);
    tf::Tensor* slots = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({n}), &slots));
    tf::Tensor none(tf::DT_INT64, tf::TensorShape({}));
    none.scalar<int64_t>()() = -1;
    OP_REQUIRES_OK(ctx, map->Find(ctx, keys, slots, none));
    const int64_t* slot = slots->flat<int64_t>().data();

    LockedVariables vars(ctx, {1, 2, 3, 4});
    if (!vars.ok()) return;
    tf::Tensor* freqs = vars.Writable(0, tf::DT_INT64, 1, "ev_freqs");
    tf::Tensor* versions = freqs ? vars.Writable(1, tf::DT_INT64, 1, "ev_versions") : nullptr;
    tf::Tensor* days = versions ? vars.Writable(2, tf::DT_INT64, 1, "ev_days") : nullptr;
    if (days == nullptr) return;
    const int64_t rows = freqs->dim_size(0);
    if (!SameRows(ctx, {versions, days}, rows)) return;
    std::vector<int64_t> miss;
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, slot[i] < rows, InvalidArgument("the map gives id ", key[i], " row ", slot[i], " of ", rows));
      if (slot[i] < 0) miss.push_back(i);
    }
    int64_t *f = freqs->flat<int64_t>().data(), *v = versions->flat<int64_t>().data();
    int64_t* d = days->flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      if (slot[i] < 0) continue;
      f[slot[i]] += occ[i];
      v[slot[i]] = step;
      d[slot[i]] = day;
    }

    const int64_t m = miss.size();
    tf::Tensor *miss_out = nullptr, *count_out = nullptr, *ready_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({m}), &miss_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({m}), &count_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, tf::TensorShape({}), &ready_out));
    std::copy(miss.begin(), miss.end(), miss_out->flat<int64_t>().data());
    float* count = count_out->flat<float>().data();
    const float* sketch = nullptr;
    int64_t width = 0;
    if (filter_freq_ > 1) {
      const tf::Tensor* s = vars.Readable(3, tf::DT_FLOAT, 1, "ev_filter_counts");
      if (s == nullptr) return;
      width = s->dim_size(0) / kDepth;
      OP_REQUIRES(ctx, width > 0, InvalidArgument("the sketch has no counters"));
      sketch = s->flat<float>().data();
    }
    int64_t ready = 0;
    int64_t at[kDepth];
    for (int64_t j = 0; j < m; ++j) {
      float c = static_cast<float>(occ[miss[j]]);
      if (sketch != nullptr) {
        SketchIndex(key[miss[j]], width, at);
        float estimate = sketch[at[0]];
        for (int k = 1; k < kDepth; ++k) estimate = std::min(estimate, sketch[at[k]]);
        c += estimate;
      }
      count[j] = c;
      ready += filter_freq_ <= 1 || c >= static_cast<float>(filter_freq_);
    }
    ready_out->scalar<int64_t>()() = ready;
  }

 private:
  int64_t filter_freq_;
};

// Resources: map, ev_keys, freqs, versions, days, free (the free stack), free_top, sketch,
// sketch_used, stats, then ev_tables in a group (N = 1). Then: keys, occurrences, members (int64
// [U]; members empty alone), slots, miss, count (AdmitFind's), victims (int64 [V], rows the stock
// ops evicted as least recently used, still tagged), evicted (int64 [members], rows evicted by
// steps), step, day. Outputs: rows (int64 [U], slots with the admitted ids' rows), targets (int64
// [A], the rows given) and new_keys (int64 [A], their ids).
class AdmitRows : public tf::OpKernel {
 public:
  explicit AdmitRows(tf::OpKernelConstruction* ctx) : tf::OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("filter_freq", &filter_freq_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tags", &tags_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &grouped_));
    OP_REQUIRES(ctx, !tags_.empty(), InvalidArgument("tags must name at least one table"));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const int base = 10 + grouped_;
    const int64_t members = tags_.size();
    if (!Vector(ctx, base, "keys")) return;
    const int64_t n = ctx->input(base).dim_size(0);
    if (!Vector(ctx, base + 1, "occurrences", n) || !Vector(ctx, base + 2, "members", grouped_ ? n : 0) ||
        !Vector(ctx, base + 3, "slots", n) || !Vector(ctx, base + 4, "miss") ||
        !Vector(ctx, base + 5, "count", ctx->input(base + 4).dim_size(0)) || !Vector(ctx, base + 6, "victims") ||
        !Vector(ctx, base + 7, "evicted", members))
      return;
    const int64_t* key = ctx->input(base).flat<int64_t>().data();
    const int64_t* occ = ctx->input(base + 1).flat<int64_t>().data();
    const int64_t* member = grouped_ ? ctx->input(base + 2).flat<int64_t>().data() : nullptr;
    const tf::Tensor& slots = ctx->input(base + 3);
    const int64_t* miss = ctx->input(base + 4).flat<int64_t>().data();
    const float* count = ctx->input(base + 5).flat<float>().data();
    const int64_t m = ctx->input(base + 4).dim_size(0);
    const tf::Tensor& victims = ctx->input(base + 6);
    const int64_t* evicted = ctx->input(base + 7).flat<int64_t>().data();
    const int64_t step = ctx->input(base + 8).scalar<int64_t>()();
    const int64_t day = ctx->input(base + 9).scalar<int64_t>()();
    for (int64_t j = 0; j < m; ++j)
      OP_REQUIRES(ctx, miss[j] >= 0 && miss[j] < n, InvalidArgument("miss[", j, "] = ", miss[j], " is not a key"));
    for (int64_t i = 0; grouped_ && i < n; ++i)
      OP_REQUIRES(ctx, member[i] >= 0 && member[i] < members,
                  InvalidArgument("members[", i, "] = ", member[i], " is not in [0, ", members, ")"));
    auto member_of = [&](int64_t i) { return grouped_ ? member[i] : 0; };

    std::vector<int> inputs = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    if (grouped_) inputs.push_back(10);
    LockedVariables vars(ctx, inputs);
    if (!vars.ok()) return;
    tf::Tensor* ids = vars.Writable(0, tf::DT_INT64, 1, "ev_keys");
    tf::Tensor* freqs = ids ? vars.Writable(1, tf::DT_INT64, 1, "ev_freqs") : nullptr;
    tf::Tensor* versions = freqs ? vars.Writable(2, tf::DT_INT64, 1, "ev_versions") : nullptr;
    tf::Tensor* days = versions ? vars.Writable(3, tf::DT_INT64, 1, "ev_days") : nullptr;
    tf::Tensor* free = days ? vars.Writable(4, tf::DT_INT64, 1, "ev_free_rows") : nullptr;
    tf::Tensor* free_top = free ? vars.Writable(5, tf::DT_INT64, 0, "ev_free_top") : nullptr;
    tf::Tensor* used = free_top ? vars.Writable(7, tf::DT_INT64, 0, "ev_filter_used") : nullptr;
    tf::Tensor* stats = used ? vars.Writable(8, tf::DT_INT64, 1, "ev_stats") : nullptr;
    tf::Tensor* row_tags = nullptr;
    if (stats == nullptr) return;
    const int64_t rows = ids->dim_size(0);
    std::vector<tf::Tensor*> state = {freqs, versions, days, free};
    if (grouped_) {
      row_tags = vars.Writable(9, tf::DT_INT64, 1, "ev_tables");
      if (row_tags == nullptr) return;
      state.push_back(row_tags);
    }
    if (!SameRows(ctx, state, rows)) return;
    OP_REQUIRES(ctx, stats->dim_size(0) == kStats * members,
                InvalidArgument("ev_stats has ", stats->dim_size(0), " counts, not ", kStats * members));
    const int64_t top = free_top->scalar<int64_t>()();
    OP_REQUIRES(ctx, top >= 0 && top <= rows, InvalidArgument("ev_free_top ", top, " is not in [0, ", rows, "]"));
    const int64_t* stack = free->flat<int64_t>().data();
    for (int64_t i = 0; i < top; ++i)
      OP_REQUIRES(ctx, stack[i] >= 0 && stack[i] < rows, InvalidArgument("free row ", stack[i], " is not a row"));
    const int64_t* victim = victims.flat<int64_t>().data();
    for (int64_t i = 0; i < victims.dim_size(0); ++i)
      OP_REQUIRES(ctx, victim[i] >= 0 && victim[i] < rows, InvalidArgument("victim ", victim[i], " is not a row"));

    // the victims' tables, before their rows take new ids (the first tag that matches, as argmax)
    int64_t* stat = stats->flat<int64_t>().data();
    for (int64_t t = 0; t < members; ++t) stat[t * kStats + 1] += evicted[t];
    for (int64_t i = 0; i < victims.dim_size(0); ++i) {
      int64_t t = 0;
      if (grouped_) {
        const int64_t tag = row_tags->flat<int64_t>()(victim[i]);
        t = std::find(tags_.begin(), tags_.end(), tag) - tags_.begin();
        if (t == members) t = 0;
      }
      stat[t * kStats + 1] += 1;
    }

    // the first ids ready take the rows on top of the free stack, lowest first
    std::vector<char> admitted(m, 0);
    int64_t ready = 0;
    for (int64_t j = 0; j < m; ++j) ready += Ready(count[j]);
    const int64_t given = std::min(ready, top);
    tf::Tensor *rows_out = nullptr, *targets = nullptr, *new_keys = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, slots.shape(), &rows_out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, tf::TensorShape({given}), &targets));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, tf::TensorShape({given}), &new_keys));
    int64_t* row = rows_out->flat<int64_t>().data();
    std::copy_n(slots.flat<int64_t>().data(), n, row);
    int64_t* target = targets->flat<int64_t>().data();
    int64_t* new_key = new_keys->flat<int64_t>().data();
    int64_t* id = ids->flat<int64_t>().data();
    int64_t *f = freqs->flat<int64_t>().data(), *v = versions->flat<int64_t>().data();
    int64_t* d = days->flat<int64_t>().data();
    for (int64_t j = 0, a = 0; j < m && a < given; ++j) {
      if (!Ready(count[j])) continue;
      admitted[j] = 1;
      const int64_t r = stack[top - 1 - a], i = miss[j];
      target[a] = r;
      new_key[a] = key[i];
      row[i] = r;
      id[r] = key[i];
      f[r] = static_cast<int64_t>(count[j]);
      v[r] = step;
      d[r] = day;
      if (grouped_) row_tags->flat<int64_t>()(r) = tags_[member[i]];
      ++a;
    }
    free_top->scalar<int64_t>()() = top - given;
    tf::lookup::LookupInterface* map = nullptr;
    OP_REQUIRES_OK(ctx, MapAt(ctx, 0, &map));
    tf::core::ScopedUnref unref(map);
    OP_REQUIRES_OK(ctx, map->Insert(ctx, *new_keys, *targets));

    if (filter_freq_ > 1) {
      tf::Tensor* s = vars.Writable(6, tf::DT_FLOAT, 1, "ev_filter_counts");
      if (s == nullptr) return;
      const int64_t width = s->dim_size(0) / kDepth;
      OP_REQUIRES(ctx, width > 0, InvalidArgument("the sketch has no counters"));
      float* sketch = s->flat<float>().data();
      std::vector<int64_t> at(m * kDepth);
      int64_t started = 0;  // counted before any update: a counter two ids share counts twice
      for (int64_t j = 0; j < m; ++j) {
        SketchIndex(key[miss[j]], width, &at[j * kDepth]);
        const float c = admitted[j] ? 0.0f : count[j];
        for (int k = 0; k < kDepth; ++k) started += sketch[at[j * kDepth + k]] == 0.0f && c > 0.0f;
      }
      for (int64_t j = 0; j < m; ++j) {
        const float c = admitted[j] ? 0.0f : count[j];
        for (int k = 0; k < kDepth; ++k) sketch[at[j * kDepth + k]] = std::max(sketch[at[j * kDepth + k]], c);
      }
      used->scalar<int64_t>()() += started;
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

  int64_t filter_freq_;
  std::vector<int64_t> tags_;
  int grouped_;
};

tf::Status FindShape(tf::shape_inference::InferenceContext* c) {
  c->set_output(0, c->input(5));
  c->set_output(1, c->Vector(c->UnknownDim()));
  c->set_output(2, c->Vector(c->UnknownDim()));
  c->set_output(3, c->Scalar());
  return absl::OkStatus();
}

tf::Status RowsShape(tf::shape_inference::InferenceContext* c) {
  int grouped = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &grouped));
  c->set_output(0, c->input(10 + grouped));
  c->set_output(1, c->Vector(c->UnknownDim()));
  c->set_output(2, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("RecpipeAdmitFind")
    .Input("map: resource")
    .Input("freqs: resource")
    .Input("versions: resource")
    .Input("days: resource")
    .Input("sketch: resource")
    .Input("keys: int64")
    .Input("occurrences: int64")
    .Input("step: int64")
    .Input("day: int64")
    .Output("slots: int64")
    .Output("miss: int64")
    .Output("count: float")
    .Output("ready: int64")
    .Attr("filter_freq: int")
    .SetIsStateful()
    .SetShapeFn(FindShape)
    .Doc("An online table's step: the ids' rows, the rows found updated, the others counted.");
REGISTER_KERNEL_BUILDER(Name("RecpipeAdmitFind").Device(tf::DEVICE_CPU), AdmitFind);

REGISTER_OP("RecpipeAdmitRows")
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
    .Input("slots: int64")
    .Input("miss: int64")
    .Input("count: float")
    .Input("victims: int64")
    .Input("evicted: int64")
    .Input("step: int64")
    .Input("day: int64")
    .Output("rows: int64")
    .Output("targets: int64")
    .Output("new_keys: int64")
    .Attr("N: int >= 0 = 0")
    .Attr("filter_freq: int")
    .Attr("tags: list(int)")
    .SetIsStateful()
    .SetShapeFn(RowsShape)
    .Doc("An online table's step: the ready ids take free rows, the others keep their counts.");
REGISTER_KERNEL_BUILDER(Name("RecpipeAdmitRows").Device(tf::DEVICE_CPU), AdmitRows);

}  // namespace recpipe
