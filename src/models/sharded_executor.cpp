#include "models/sharded_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "models/collective.h"

namespace exl3 {

namespace {

// fn(r) for every rank at once: rank 0 on the caller's thread, the others on threads kept for the model's life.
class RankThreads {
public:
    explicit RankThreads(int ranks) {
        for (int r = 1; r < ranks; ++r) workers_.emplace_back([this, r] { loop(r); });
    }
    ~RankThreads() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        go_.notify_all();
        for (std::thread& t : workers_) t.join();
    }

    void run(const std::function<void(int)>& fn) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            fn_ = &fn;
            pending_ = static_cast<int>(workers_.size());
            ++gen_;
        }
        go_.notify_all();
        fn(0);
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [&] { return pending_ == 0; });
        fn_ = nullptr;
    }

private:
    void loop(int r) {
        uint64_t seen = 0;
        for (;;) {
            const std::function<void(int)>* fn = nullptr;
            {
                std::unique_lock<std::mutex> lock(mu_);
                go_.wait(lock, [&] { return stop_ || gen_ != seen; });
                if (stop_) return;
                seen = gen_;
                fn = fn_;
            }
            (*fn)(r);
            std::lock_guard<std::mutex> lock(mu_);
            if (--pending_ == 0) done_.notify_all();
        }
    }

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable go_, done_;
    const std::function<void(int)>* fn_ = nullptr;
    uint64_t gen_ = 0;
    int pending_ = 0;
    bool stop_ = false;
};

struct Rank {
    ModelConfig cfg;
    HostWeights weights;               // views into the model's weights, and the copies slices needed
    std::unique_ptr<ThreadPool> pool;  // CPU ranks of a sharded model: threads of their own
    std::unique_ptr<Executor> exec;
};

class ShardedExecutor final : public Executor {
public:
    ShardedExecutor(ShardPlan plan, std::unique_ptr<Collective> comm, std::vector<std::unique_ptr<Rank>> ranks)
        : plan_(std::move(plan)), comm_(std::move(comm)), ranks_(std::move(ranks)), threads_(plan_.ranks) {}

    std::string device() const override {
        const std::string d0 = rank0().device();
        if (ranks_.size() == 1 || d0.rfind("cuda:", 0) != 0) return d0;
        std::string s = "cuda:";
        for (size_t r = 0; r < ranks_.size(); ++r) s += (r ? "," : "") + ranks_[r]->exec->device().substr(5);
        return s;
    }
    PagePoolOptions page_pool_options() const override {
        PagePoolOptions po = rank0().page_pool_options();  // one page id names a page on every rank
        for (const auto& r : ranks_) {
            const PagePoolOptions o = r->exec->page_pool_options();
            po.capacity = std::min(po.capacity, o.capacity);
            if (o.max_pages > 0) po.max_pages = po.max_pages > 0 ? std::min(po.max_pages, o.max_pages) : o.max_pages;
        }
        return po;
    }
    bool pages_preallocated() const override { return rank0().pages_preallocated(); }
    int64_t kv_bytes_per_token() const override {
        int64_t b = 0;
        for (const auto& r : ranks_) b += r->exec->kv_bytes_per_token();
        return b;
    }
    // A hybrid model's recurrent state (hybrids run on one rank: the plan refuses more).
    int64_t state_bytes() const override { return rank0().state_bytes(); }
    int max_state_slots() const override { return rank0().max_state_slots(); }
    Status copy_states(const std::vector<std::pair<int32_t, int32_t>>& copies) override {
        return ranks_[0]->exec->copy_states(copies);
    }
    bool prefers_uniform_steps() const override { return rank0().prefers_uniform_steps(); }
    int max_uniform_tokens() const override { return rank0().max_uniform_tokens(); }

    // Every rank runs the step on its shard; rank 0 ends up with the logits (gathered by the ranks' heads).
    Status forward(const StepPlan& plan, const std::vector<Sequence::Impl*>& seqs, float* logits) override {
        if (broken_)
            return internal_error("tensor parallelism: a failed step broke the communicator; load the model again");
        std::mutex mu;
        Status first;  // the first rank to fail says why; the others then fail because it aborted
        threads_.run([&](int r) {
            Status s = ranks_[static_cast<size_t>(r)]->exec->forward(plan, seqs, r == 0 ? logits : nullptr);
            if (s.is_ok()) return;
            std::lock_guard<std::mutex> lock(mu);
            if (!first.is_ok()) return;
            first = ranks_.size() > 1 ? s.with_context(fmt::format("rank {}", r)) : s;
            if (comm_) comm_->abort(first.message());
        });
        if (!first.is_ok() && comm_) broken_ = !comm_->recover();
        return first;
    }

    bool draws_on_device() const override { return rank0().draws_on_device(); }
    Status draw(const std::vector<int>& rows, const std::vector<DrawSettings>& settings, bool logprobs,
                std::vector<Drawn>* out) override {
        return ranks_[0]->exec->draw(rows, settings, logprobs, out);
    }
    Status argmax(int rows, std::vector<int32_t>* out) override { return ranks_[0]->exec->argmax(rows, out); }
    Status logits_row(int row, float* out) override { return ranks_[0]->exec->logits_row(row, out); }

private:
    const Executor& rank0() const { return *ranks_[0]->exec; }

    ShardPlan plan_;
    std::unique_ptr<Collective> comm_;  // null for one rank
    std::vector<std::unique_ptr<Rank>> ranks_;
    RankThreads threads_;
    bool broken_ = false;
};

// The GPUs' free memory as split weights, unless they are within 5 % of each other (then an even split).
Status memory_weights(const std::vector<int>& devices, std::vector<double>* weights) {
    EXL3_ASSIGN_OR_RETURN(std::vector<size_t> free, cuda_free_memory(devices));
    const auto [lo, hi] = std::minmax_element(free.begin(), free.end());
    if (*lo == 0)
        return out_of_range(fmt::format("GPU {} has no free memory", devices[static_cast<size_t>(lo - free.begin())]));
    if (static_cast<double>(*hi) <= 1.05 * static_cast<double>(*lo)) return Status::ok();
    weights->assign(free.begin(), free.end());
    return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Executor>> make_sharded_executor(const ModelConfig& cfg, const HostWeights& w, ThreadPool& pool,
                                                        const ExecutorOptions& eo, const ParallelOptions& po) {
    const bool cuda = !po.devices.empty();
    ShardOptions so = po.shard;
    if (cuda) {
        if (so.ranks != static_cast<int>(po.devices.size()))
            return invalid_argument(
                fmt::format("tensor parallelism over {} ranks on {} GPUs", so.ranks, po.devices.size()));
        if (so.ranks > 1 && so.weights.empty()) EXL3_RETURN_IF_ERROR(memory_weights(po.devices, &so.weights));
    }
    EXL3_ASSIGN_OR_RETURN(ShardPlan plan, plan_shards(cfg, w, so));
    std::unique_ptr<Collective> comm;
    auto link_of = [&](int r) {  // the rank's logit columns (and, once it exists, the communicator)
        return plan.ranks > 1 ? RankLink{comm.get(), r, plan.vocab_bounds()} : RankLink{};
    };
    // Every rank's shard planned before any rank allocates (the communicator's buffers come after), each rank's
    // slices made and dropped in turn.
    std::vector<ExecutorOptions> opts(static_cast<size_t>(plan.ranks), eo);
    if (cuda && po.planner.count) {
        for (int r = 0; r < plan.ranks; ++r) {
            const ModelConfig rc = shard_config(cfg, plan.shards[static_cast<size_t>(r)]);
            HostWeights rw;
            EXL3_RETURN_IF_ERROR(shard_weights(w, cfg, plan, r, &rw));
            EXL3_RETURN_IF_ERROR(po.planner.count(r, po.devices[static_cast<size_t>(r)], rc, rw, link_of(r)));
        }
        EXL3_ASSIGN_OR_RETURN(opts, po.planner.resolve(eo));
    }
    if (plan.ranks > 1) {
        if (cuda) {
            EXL3_ASSIGN_OR_RETURN(comm, make_cuda_collective(po.devices));
        } else {
            comm = make_host_collective(plan.ranks);
        }
        log_info("tensor parallel: {}; {}", plan.describe(), comm->name());
    }
    std::vector<std::unique_ptr<Rank>> ranks;
    for (int r = 0; r < plan.ranks; ++r) {
        auto rank = std::make_unique<Rank>();
        rank->cfg = shard_config(cfg, plan.shards[static_cast<size_t>(r)]);
        EXL3_RETURN_IF_ERROR(shard_weights(w, cfg, plan, r, &rank->weights));
        ExecutorOptions o = opts[static_cast<size_t>(r)];
        o.link = link_of(r);
        if (cuda) {
            o.device = po.devices[static_cast<size_t>(r)];
            auto e = make_cuda_executor(rank->cfg, rank->weights, o);
            if (!e.is_ok()) return e.status().with_context(fmt::format("cuda:{}", o.device));
            rank->exec = std::move(*e);
            // On the GPU now: the slices' host copies go, unless the CPU reads the weights in place (offloaded
            // layers run there, or MoE blocks; one rank only).
            const bool cpu_reads = (o.offload_layers > 0 && o.offload_mode == OffloadMode::kCpu) ||
                                   o.offload_expert_layers > 0;
            if (!cpu_reads) rank->weights = HostWeights{};
        } else {
            if (plan.ranks > 1) rank->pool = std::make_unique<ThreadPool>(std::max(1, pool.size() / plan.ranks));
            EXL3_ASSIGN_OR_RETURN(rank->exec,
                                  make_cpu_executor(rank->cfg, rank->weights, rank->pool ? *rank->pool : pool, o));
        }
        ranks.push_back(std::move(rank));
    }
    return std::unique_ptr<Executor>(
        std::make_unique<ShardedExecutor>(std::move(plan), std::move(comm), std::move(ranks)));
}

}  // namespace exl3
