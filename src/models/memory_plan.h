// The memory planner (docs/memory.md): fits a model's GPU memory to a budget before anything is allocated, from the
// backend's counted costs (models/executor.h: DeviceCosts). It resolves what the options leave open -- the KV
// cache's size (what the budget leaves), a context that does not fit (shortened when not given), the number of
// offloaded layers (-1: as few as fit) -- and, when nothing fits, says by how much and what would.
#pragma once

#include <optional>
#include <string>

#include "exl3/memory.h"
#include "exl3/model.h"
#include "format/model_config.h"
#include "models/executor.h"

namespace exl3 {

struct PlanInput {
    LoadOptions options;                        // as given
    int model_context = 0;                      // the config's context length
    std::string device;                         // "cuda:N"
    std::optional<DeviceMemory> device_memory;  // asked of the GPU (required when options.gpu_memory is 0)
    double decoder_bpw = 0;                     // the EXL3 decoder linears' average bits (0: none)
};

// The plan, fitting or not (MemoryPlan::fits; refusal() says why). Errors only for options that make no plan at all
// (no budget and no device to ask).
Result<MemoryPlan> plan_memory(const ModelConfig& cfg, const DeviceCosts& costs, const PlanInput& in);

}  // namespace exl3
