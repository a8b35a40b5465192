#pragma once
// TEMPORARY ADAPTER (branch `server`): stands in for src/chat/chat_template.h
// of the `jinja` branch, which renders the checkpoint's own Jinja chat
// template. Same signature, minimal formatting (chatml / llama3 / gemma /
// plain, chosen from the tokenizer's special tokens), ONLY so the server
// builds and its tests run before that branch lands. Once
// src/chat/chat_template.h is on main: merge main, include it instead and
// delete this file and chat_template_adapter.cpp.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "kvgraph/model.h"
#include "kvgraph/tokenizer.h"

namespace kvgraph::chat {

std::string render_conversation(const std::filesystem::path& model_dir, const Model& model, const Tokenizer& tok,
                                const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                bool add_generation_prompt, const nlohmann::ordered_json& extra = {});

}  // namespace kvgraph::chat
