// The server with a checkpoint that ships a chat template: the embedded
// model's files beside a published template (tests/fixtures/chat_templates).
// /apply-template must give what Python's jinja2 gives for the same
// conversation (golden.json), tools included; a template that raises is a
// 400; a template that does not parse is a load error.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "support/files.h"
#include "support/temp_dir.h"
#include "support/test_server.h"

using namespace kvgraph;
using namespace kvgraph::testing;
namespace fs = std::filesystem;

namespace {

const fs::path kTemplates = fs::path(KVGRAPH_SOURCE_DIR) / "tests" / "fixtures" / "chat_templates";

ojson read_json(const fs::path& p) {
  std::ifstream in(p);
  return ojson::parse(in);
}

// The default model's files in a directory of its own, with `template_file`
// as its chat_template.jinja.
fs::path model_with_template(const TempDir& tmp, const std::string& template_text) {
  const fs::path dir = tmp.path() / "model";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    fs::create_symlink(default_model_path() / f, dir / f);
  write_bytes(dir / "chat_template.jinja", template_text);
  return dir;
}

server::LoadFn loader(const fs::path& dir) {
  return [dir] {
    auto m = Model::load(dir, Device::CPU);
    return server::ServedModel::make(m, check_vocab(Tokenizer::from_file(dir / "tokenizer.json"), m->config()), "t");
  };
}

std::string slurp_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(ServerTemplate, ApplyTemplateEqualsJinja2OnAPublishedTemplate) {
  const std::string name = "Qwen-Qwen2.5-7B-Instruct.jinja";  // uses no bos_token: the default model's does not matter
  TempDir tmp;
  TestServer ts({}, loader(model_with_template(tmp, slurp_text(kTemplates / name))));
  const ojson golden = read_json(kTemplates / "golden.json")["templates"][name];
  ojson conversations;
  for (const auto& c : read_json(fs::path(KVGRAPH_SOURCE_DIR) / "tests" / "chat" / "conversations.json"))
    conversations[c["name"].get<std::string>()] = c["context"];
  int compared = 0;
  for (const char* conv : {"user", "system_user", "multi_turn", "multi_turn_ends_with_assistant", "tools_first_turn",
                           "tools_system_first_turn", "tools_call_and_result", "tools_call_none_content",
                           "tools_two_calls"}) {
    const ojson& ctx = conversations[conv];
    ASSERT_TRUE(golden[conv].contains("text")) << conv;
    ojson body = {{"messages", ctx["messages"]}, {"add_generation_prompt", ctx["add_generation_prompt"]}};
    if (ctx["tools"].is_array()) body["tools"] = ctx["tools"];
    Reply r = ts.post("/apply-template", body);
    ASSERT_EQ(r.status, 200) << conv << ": " << r.body;
    EXPECT_EQ(r.json["prompt"], golden[conv]["text"]) << conv;
    ++compared;
  }
  EXPECT_EQ(compared, 9);
  // A chat completion sees exactly that text: its prompt is those ids.
  const ojson& ctx = conversations["tools_first_turn"];
  Reply c = ts.post("/v1/chat/completions",
                    {{"messages", ctx["messages"]}, {"tools", ctx["tools"]}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.json["usage"]["prompt_tokens"],
            load_default().tokenizer.encode(golden["tools_first_turn"]["text"].get<std::string>(), false).size());
}

TEST(ServerTemplate, ATemplateThatRaisesIsA400) {
  TempDir tmp;
  TestServer ts({}, loader(model_with_template(tmp, slurp_text(kTemplates / "google-gemma-2-2b-it.jinja"))));
  const ojson messages = {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}};
  for (const char* path : {"/v1/chat/completions", "/apply-template"}) {
    Reply r = ts.post(path, {{"messages", messages}, {"max_tokens", 2}});
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.json["error"]["code"], "template_error");
    EXPECT_NE(r.json["error"]["message"].get<std::string>().find("System role not supported"), std::string::npos)
        << r.body;
  }
  EXPECT_EQ(ts.server().slots_busy(), 0);
  // Without the system message it renders.
  EXPECT_EQ(ts.post("/v1/chat/completions", {{"messages", {messages[1]}}, {"max_tokens", 2}}).status, 200);
}

TEST(ServerTemplate, ATemplateThatDoesNotParseIsALoadError) {
  TempDir tmp;
  TestServer ts({}, loader(model_with_template(tmp, "{% for m in messages %}{{ m.content }")), /*wait=*/false);
  EXPECT_THROW(ts.server().wait_loaded(), Error);
  Reply h = ts.get("/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.json["error"]["code"], "model_failed") << h.body;
}
