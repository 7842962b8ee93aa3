// A mixture-of-experts checkpoint with every expert chosen for every token (num_experts_per_tok = the experts, every
// group kept): a copy of its config beside links to its weights. Routing is then smooth, so the model can be compared
// like a dense one (the CUDA tests against the CPU, the converter's error falling with the bits).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace exl3::test {

inline std::string all_experts_copy(const std::string& dir, const std::string& name) {
    std::ifstream in(dir + "/config.json");
    nlohmann::json c = nlohmann::json::parse(in);
    nlohmann::json& t = c.contains("text_config") ? c["text_config"] : c;
    for (const char* k : {"num_experts", "num_local_experts", "n_routed_experts"})
        if (t.contains(k)) t["num_experts_per_tok"] = t[k];
    if (t.contains("n_group")) t["topk_group"] = t["n_group"];
    const std::filesystem::path out = std::filesystem::temp_directory_path() / ("exl3_all_experts_" + name);
    std::filesystem::remove_all(out);
    std::filesystem::create_directories(out);
    std::ofstream(out / "config.json") << c.dump(2);
    for (const auto& f : std::filesystem::directory_iterator(dir))
        if (f.path().extension() == ".safetensors" || f.path().filename() == "model.safetensors.index.json")
            std::filesystem::create_symlink(std::filesystem::absolute(f.path()), out / f.path().filename());
    return out.string();
}

}  // namespace exl3::test
