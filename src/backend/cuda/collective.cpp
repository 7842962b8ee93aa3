// The CUDA backend's collectives for tensor parallelism (models/collective.h): NCCL, loaded at run time so that the
// engine builds and runs where it is missing, or else peer-to-peer copies and a local sum.
#include "models/collective.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/ops.cuh"
#include "core/log.h"
#include "core/rank_barrier.h"

namespace exl3 {

namespace cuda {

namespace {

// The NCCL entry points used here, as the library exports them (nccl.h 2.x; its enums are ints: ncclFloat32 = 7,
// ncclSum = 0, ncclSuccess = 0).
struct NcclApi {
    using Comm = void*;
    static constexpr int kFloat32 = 7, kSum = 0;
    int (*GetVersion)(int*) = nullptr;
    int (*CommInitAll)(Comm*, int, const int*) = nullptr;
    int (*CommDestroy)(Comm) = nullptr;
    int (*CommAbort)(Comm) = nullptr;
    int (*AllReduce)(const void*, void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
    int (*Send)(const void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
    int (*Recv)(void*, size_t, int, int, Comm, cudaStream_t) = nullptr;
    int (*GroupStart)() = nullptr;
    int (*GroupEnd)() = nullptr;
    const char* (*GetErrorString)(int) = nullptr;
    std::string version;

    Status check(int r, const char* what) const {
        if (r == 0) return Status::ok();
        return internal_error(fmt::format("NCCL {}: {} ({})", what, GetErrorString ? GetErrorString(r) : "?", r));
    }
};

// libnccl.so.2 from the library search path (LD_LIBRARY_PATH: the nvidia-nccl-cu13 package's nvidia/nccl/lib), once
// per process.
Result<const NcclApi*> load_nccl() {
    static std::once_flag once;
    static NcclApi api;
    static Status status;
    std::call_once(once, [] {
        void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char* e = dlerror();
            status = not_found(fmt::format("NCCL (libnccl.so.2) is not on the library path: {}", e ? e : "not found"));
            return;
        }
        bool ok = true;
        auto get = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            ok = ok && fn;
        };
        get(api.GetVersion, "ncclGetVersion");
        get(api.CommInitAll, "ncclCommInitAll");
        get(api.CommDestroy, "ncclCommDestroy");
        get(api.CommAbort, "ncclCommAbort");
        get(api.AllReduce, "ncclAllReduce");
        get(api.Send, "ncclSend");
        get(api.Recv, "ncclRecv");
        get(api.GroupStart, "ncclGroupStart");
        get(api.GroupEnd, "ncclGroupEnd");
        get(api.GetErrorString, "ncclGetErrorString");
        int v = 0;
        if (!ok || api.GetVersion(&v) != 0) {
            status = unsupported("the NCCL library found lacks ncclSend/ncclRecv or other entry points (NCCL >= 2.7)");
            return;
        }
        api.version = fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
    });
    if (!status.is_ok()) return status;
    return &api;
}

// One communicator per GPU (ncclCommInitAll), each rank's calls on its own stream. Capturable.
class NcclCollective final : public Collective {
public:
    static Result<std::unique_ptr<Collective>> create(const NcclApi* api, const std::vector<int>& devices) {
        auto c = std::unique_ptr<NcclCollective>(new NcclCollective(api, static_cast<int>(devices.size())));
        // NVLink multicast (NVLS) off, before NCCL reads its environment: on shared GPU machines a program using it
        // can put the host's GPUs out of service, and the small all-reduces here gain nothing from it.
        setenv("NCCL_NVLS_ENABLE", "0", 1);
        EXL3_RETURN_IF_ERROR(api->check(api->CommInitAll(c->comms_.data(), c->n_, devices.data()), "ncclCommInitAll"));
        c->live_ = true;
        EXL3_RETURN_IF_ERROR(c->warm_up(devices));
        return std::unique_ptr<Collective>(std::move(c));
    }
    ~NcclCollective() override {
        if (!live_ || aborted_) return;  // an aborted communicator is freed by the abort
        for (NcclApi::Comm c : comms_) api_->CommDestroy(c);
    }

    int ranks() const override { return n_; }
    std::string name() const override { return "NCCL " + api_->version; }
    bool capturable() const override { return true; }

    Status all_reduce(int rank, float* data, size_t n, void* stream) override {
        return api_->check(api_->AllReduce(data, data, n, NcclApi::kFloat32, NcclApi::kSum, comm(rank), st(stream)),
                           "all-reduce");
    }

    // Ranks 1.. send their blocks to rank 0, which receives them into scratch and lays every block out in dst.
    Status gather_columns(int rank, const float* src, int rows, const std::vector<int>& bounds, float* dst,
                          float* scratch, void* stream) override {
        const size_t R = static_cast<size_t>(rows);
        auto cols = [&](int r) {
            return static_cast<size_t>(bounds[static_cast<size_t>(r) + 1] - bounds[static_cast<size_t>(r)]);
        };
        EXL3_RETURN_IF_ERROR(api_->check(api_->GroupStart(), "group start"));
        Status s;
        if (rank == 0) {
            for (int r = 1; r < n_ && s.is_ok(); ++r)
                s = api_->check(api_->Recv(scratch + R * static_cast<size_t>(bounds[static_cast<size_t>(r)]),
                                           R * cols(r), NcclApi::kFloat32, r, comm(0), st(stream)),
                                "receive");
        } else {
            s = api_->check(api_->Send(src, R * cols(rank), NcclApi::kFloat32, 0, comm(rank), st(stream)), "send");
        }
        const Status end = api_->check(api_->GroupEnd(), "group end");
        EXL3_RETURN_IF_ERROR(s);
        EXL3_RETURN_IF_ERROR(end);
        if (rank != 0) return Status::ok();
        for (int r = 0; r < n_; ++r) {
            const float* from = r == 0 ? src : scratch + R * static_cast<size_t>(bounds[static_cast<size_t>(r)]);
            EXL3_RETURN_IF_ERROR(check_cuda(
                cudaMemcpy2DAsync(dst + bounds[static_cast<size_t>(r)],
                                  static_cast<size_t>(bounds.back()) * sizeof(float), from, cols(r) * sizeof(float),
                                  cols(r) * sizeof(float), R, cudaMemcpyDeviceToDevice, st(stream)),
                "logits gather"));
        }
        return Status::ok();
    }

    void abort(const std::string& why) override {
        std::lock_guard<std::mutex> lock(mu_);
        if (aborted_) return;
        aborted_ = true;
        log_warn("tensor parallelism: aborting the NCCL communicators ({})", why);
        for (NcclApi::Comm c : comms_) api_->CommAbort(c);
    }
    bool recover() override { return !aborted_; }

private:
    // One all-reduce and one gather, driven from this thread for every GPU (NCCL's group calls): NCCL connects its
    // channels lazily on first use, which must not happen inside a graph capture (a rank's first step may be one).
    Status warm_up(const std::vector<int>& devices) {
        std::vector<DeviceBuffer> buf(devices.size());
        std::vector<cudaStream_t> streams(devices.size(), nullptr);
        Status s;
        for (size_t r = 0; r < devices.size() && s.is_ok(); ++r) {
            s = check_cuda(cudaSetDevice(devices[r]), "cudaSetDevice");
            if (s.is_ok()) s = buf[r].reserve(2 * static_cast<size_t>(n_) * sizeof(float));
            if (s.is_ok()) s = check_cuda(cudaMemsetAsync(buf[r].get(), 0, buf[r].bytes(), nullptr), "warm-up");
            if (s.is_ok()) s = check_cuda(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), "stream");
            if (s.is_ok()) s = check_cuda(cudaDeviceSynchronize(), "warm-up");
        }
        if (s.is_ok()) s = api_->check(api_->GroupStart(), "group start");
        for (int r = 0; r < n_ && s.is_ok(); ++r)
            s = api_->check(api_->AllReduce(buf[static_cast<size_t>(r)].get(), buf[static_cast<size_t>(r)].get(), 1,
                                            NcclApi::kFloat32, NcclApi::kSum, comm(r), streams[static_cast<size_t>(r)]),
                            "warm-up all-reduce");
        for (int r = 1; r < n_ && s.is_ok(); ++r) {
            s = api_->check(api_->Send(buf[static_cast<size_t>(r)].get(), 1, NcclApi::kFloat32, 0, comm(r),
                                       streams[static_cast<size_t>(r)]),
                            "warm-up send");
            if (s.is_ok())
                s = api_->check(api_->Recv(buf[0].as<float>() + n_ + r, 1, NcclApi::kFloat32, r, comm(0), streams[0]),
                                "warm-up receive");
        }
        if (s.is_ok()) s = api_->check(api_->GroupEnd(), "group end");
        for (size_t r = 0; r < devices.size(); ++r) {
            cudaSetDevice(devices[r]);
            if (streams[r]) {
                const Status w = check_cuda(cudaStreamSynchronize(streams[r]), "warm-up");
                if (s.is_ok()) s = w;
                cudaStreamDestroy(streams[r]);
            }
        }
        return s;
    }

    NcclCollective(const NcclApi* api, int n) : api_(api), n_(n), comms_(static_cast<size_t>(n), nullptr) {}
    NcclApi::Comm comm(int rank) const { return comms_[static_cast<size_t>(rank)]; }
    static cudaStream_t st(void* s) { return static_cast<cudaStream_t>(s); }

    const NcclApi* api_;
    const int n_;
    std::vector<NcclApi::Comm> comms_;
    bool live_ = false;
    std::mutex mu_;
    bool aborted_ = false;
};

// Without NCCL: every rank copies the others' buffers into its own device memory (cudaMemcpyPeerAsync, after their
// producers: cross-device events) and sums them in rank order, so every rank holds the same bits. The ranks meet at
// host barriers, which a CUDA graph cannot hold: steps run eagerly.
class PeerCollective final : public Collective {
public:
    static Result<std::unique_ptr<Collective>> create(const std::vector<int>& devices) {
        auto c = std::unique_ptr<PeerCollective>(new PeerCollective(devices));
        for (size_t r = 0; r < devices.size(); ++r) {
            EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(devices[r]), "cudaSetDevice"));
            for (int d : devices) {  // direct reads where the GPUs allow them; the copies work either way
                int can = 0;
                if (d != devices[r] && cudaDeviceCanAccessPeer(&can, devices[r], d) == cudaSuccess && can) {
                    const cudaError_t e = cudaDeviceEnablePeerAccess(d, 0);
                    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) return check_cuda(e, "peer access");
                    cudaGetLastError();
                }
            }
            EXL3_RETURN_IF_ERROR(check_cuda(cudaEventCreateWithFlags(&c->ready_[r], cudaEventDisableTiming), "event"));
            EXL3_RETURN_IF_ERROR(check_cuda(cudaEventCreateWithFlags(&c->copied_[r], cudaEventDisableTiming), "event"));
        }
        return std::unique_ptr<Collective>(std::move(c));
    }
    ~PeerCollective() override {
        for (size_t r = 0; r < dev_.size(); ++r) {
            cudaSetDevice(dev_[r]);
            if (ready_[r]) cudaEventDestroy(ready_[r]);
            if (copied_[r]) cudaEventDestroy(copied_[r]);
        }
    }

    int ranks() const override { return n_; }
    std::string name() const override { return "peer copies"; }

    Status all_reduce(int rank, float* data, size_t n, void* stream) override {
        const size_t r = static_cast<size_t>(rank);
        cudaStream_t s = static_cast<cudaStream_t>(stream);
        EXL3_RETURN_IF_ERROR(publish(rank, data, s));
        EXL3_RETURN_IF_ERROR(stage_[r].reserve(static_cast<size_t>(n_) * n * sizeof(float)));
        float* stage = stage_[r].as<float>();
        for (int o = 0; o < n_; ++o) {  // every rank's values into stage[o], own included
            const size_t so = static_cast<size_t>(o);
            if (o == rank) {
                EXL3_RETURN_IF_ERROR(check_cuda(
                    cudaMemcpyAsync(stage + so * n, data, n * sizeof(float), cudaMemcpyDeviceToDevice, s), "stage"));
                continue;
            }
            EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamWaitEvent(s, ready_[so], 0), "wait"));
            EXL3_RETURN_IF_ERROR(check_cuda(
                cudaMemcpyPeerAsync(stage + so * n, dev_[r], ptr_[so], dev_[so], n * sizeof(float), s), "peer copy"));
        }
        EXL3_RETURN_IF_ERROR(finish_reads(rank, s));  // nobody reads `data` any more: overwrite it
        EXL3_RETURN_IF_ERROR(
            check_cuda(cudaMemcpyAsync(data, stage, n * sizeof(float), cudaMemcpyDeviceToDevice, s), "sum"));
        for (size_t o = 1; o < static_cast<size_t>(n_); ++o)
            EXL3_RETURN_IF_ERROR(check_cuda(add_f32(data, stage + o * n, static_cast<int64_t>(n), s), "sum"));
        return Status::ok();
    }

    Status gather_columns(int rank, const float* src, int rows, const std::vector<int>& bounds, float* dst,
                          float* scratch, void* stream) override {
        const size_t R = static_cast<size_t>(rows);
        cudaStream_t s = static_cast<cudaStream_t>(stream);
        EXL3_RETURN_IF_ERROR(publish(rank, const_cast<float*>(src), s));
        if (rank == 0) {
            for (int r = 0; r < n_; ++r) {
                const size_t sr = static_cast<size_t>(r), c0 = static_cast<size_t>(bounds[sr]);
                const size_t w = static_cast<size_t>(bounds[sr + 1]) - c0;
                const float* from = src;
                if (r != 0) {  // the peer's block next to rank 0 first, then laid out like its own
                    EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamWaitEvent(s, ready_[sr], 0), "wait"));
                    EXL3_RETURN_IF_ERROR(check_cuda(
                        cudaMemcpyPeerAsync(scratch + R * c0, dev_[0], ptr_[sr], dev_[sr], R * w * sizeof(float), s),
                        "peer copy"));
                    from = scratch + R * c0;
                }
                EXL3_RETURN_IF_ERROR(
                    check_cuda(cudaMemcpy2DAsync(dst + c0, static_cast<size_t>(bounds.back()) * sizeof(float), from,
                                                 w * sizeof(float), w * sizeof(float), R, cudaMemcpyDeviceToDevice, s),
                               "logits gather"));
            }
        }
        return finish_reads(rank, s);
    }

    void abort(const std::string& why) override { barrier_.abort(why); }
    bool recover() override {
        barrier_.reset();
        return true;
    }

private:
    explicit PeerCollective(std::vector<int> devices)
        : dev_(std::move(devices)),
          n_(static_cast<int>(dev_.size())),
          ready_(dev_.size(), nullptr),
          copied_(dev_.size(), nullptr),
          ptr_(dev_.size(), nullptr),
          stage_(dev_.size()),
          barrier_(n_) {}

    // `data` is final on this rank's stream from here (ready), and every rank knows where it is.
    Status publish(int rank, float* data, cudaStream_t s) {
        const size_t r = static_cast<size_t>(rank);
        EXL3_RETURN_IF_ERROR(check_cuda(cudaSetDevice(dev_[r]), "cudaSetDevice"));
        ptr_[r] = data;
        EXL3_RETURN_IF_ERROR(check_cuda(cudaEventRecord(ready_[r], s), "event"));
        return barrier_.arrive_and_wait();
    }

    // This rank's copies from the others are enqueued (copied); once every rank's are, each waits for the others'
    // before its buffer may change.
    Status finish_reads(int rank, cudaStream_t s) {
        EXL3_RETURN_IF_ERROR(check_cuda(cudaEventRecord(copied_[static_cast<size_t>(rank)], s), "event"));
        EXL3_RETURN_IF_ERROR(barrier_.arrive_and_wait());
        for (int o = 0; o < n_; ++o)
            if (o != rank)
                EXL3_RETURN_IF_ERROR(check_cuda(cudaStreamWaitEvent(s, copied_[static_cast<size_t>(o)], 0), "wait"));
        return Status::ok();
    }

    std::vector<int> dev_;
    const int n_;
    std::vector<cudaEvent_t> ready_, copied_;
    std::vector<float*> ptr_;
    std::vector<DeviceBuffer> stage_;
    RankBarrier barrier_;
};

}  // namespace

}  // namespace cuda

Result<std::unique_ptr<Collective>> make_cuda_collective(const std::vector<int>& devices) {
    for (size_t i = 0; i < devices.size(); ++i)  // several ranks on one GPU (tests): NCCL refuses, copies do not
        if (std::count(devices.begin(), devices.end(), devices[i]) > 1) return cuda::PeerCollective::create(devices);
    auto api = cuda::load_nccl();
    if (api.is_ok()) {
        auto c = cuda::NcclCollective::create(*api, devices);
        if (c.is_ok()) return c;
        log_warn("tensor parallelism: {}; falling back to peer copies", c.status().message());
    } else {
        log_warn(
            "tensor parallelism: {}; falling back to peer copies (slower; no CUDA graphs). Install NCCL (e.g. "
            "the nvidia-nccl-cu13 Python package) and put its lib folder on LD_LIBRARY_PATH",
            api.status().message());
    }
    return cuda::PeerCollective::create(devices);
}

Result<std::vector<size_t>> cuda_free_memory(const std::vector<int>& devices) {
    std::vector<size_t> out;
    for (int d : devices) {
        size_t free = 0, total = 0;
        EXL3_RETURN_IF_ERROR(
            cuda::check_cuda(cudaSetDevice(d), "cudaSetDevice").with_context(fmt::format("GPU {}", d)));
        EXL3_RETURN_IF_ERROR(cuda::check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"));
        out.push_back(free);
    }
    return out;
}

}  // namespace exl3
