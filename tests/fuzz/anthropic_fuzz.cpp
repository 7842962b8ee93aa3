// libFuzzer: arbitrary bytes as an Anthropic Messages body (/v1/messages and /v1/messages/count_tokens). Parsing
// must end in a MessagesRequest or an ApiError with a 4xx status, never a crash. The content-block writer is fed what
// a model might write (the bytes as reply text, split in two, through the reply parser with <think> reasoning and
// Hermes tool calls): its blocks must be well formed (indexes in order, every started block stopped, tool_use input
// an object, thinking blocks with their text).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/anthropic.h"

namespace {

void check_blocks(const std::string& text) {
    using exl3::chat::ReplyParser;
    exl3::chat::ReplyOptions options;
    options.tools = exl3::chat::ToolFormat::kHermes;
    options.reasoning = {exl3::chat::ReasoningKind::kTags, "<think>", "</think>"};
    options.starts_in_reasoning = !text.empty() && (text[0] & 1);
    ReplyParser parser(options);
    exl3::server::ContentBlocks blocks;
    exl3::server::ContentBlocks::Events events;
    std::vector<ReplyParser::Piece> pieces;
    const size_t half = text.size() / 2;
    parser.feed(std::string_view(text).substr(0, half), &pieces);
    blocks.feed(pieces, &events);
    pieces.clear();
    parser.feed(std::string_view(text).substr(half), &pieces);
    parser.finish(&pieces);
    blocks.feed(pieces, &events);
    blocks.close(&events);
    int open = -1;
    size_t next = 0;
    for (const auto& e : events) {
        const std::string type = e["type"];
        const size_t index = e["index"];
        if (type == "content_block_start") {
            if (open != -1 || index != next) std::abort();
            open = static_cast<int>(index);
            ++next;
        } else if (type == "content_block_stop") {
            if (open != static_cast<int>(index)) std::abort();
            open = -1;
        } else if (type != "content_block_delta" || open != static_cast<int>(index)) {
            std::abort();
        }
    }
    if (open != -1 || blocks.content().size() != next) std::abort();
    for (const auto& b : blocks.content()) {
        if (b["type"] == "tool_use" && !b["input"].is_object()) std::abort();
        if (b["type"] == "thinking" && (!b["thinking"].is_string() || !b["signature"].is_string())) std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const nlohmann::ordered_json body = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!body.is_discarded()) {
        for (bool count_tokens : {false, true}) {
            exl3::server::MessagesRequest r;
            auto err = exl3::server::parse_messages_request(body, count_tokens, &r);
            if (err && (err->http_status < 400 || err->http_status >= 500)) std::abort();
        }
    }
    check_blocks(text);
    return 0;
}
