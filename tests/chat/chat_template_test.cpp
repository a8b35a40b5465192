// ChatTemplate (finding a checkpoint's template, rendering it with the
// variables transformers passes) and the per-family formats for checkpoints
// without one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "chat/chat_format.h"
#include "chat/chat_template.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/temp_dir.h"

using namespace kvgraph;
using chat::ChatTemplate;
using kvgraph::testing::error_of;
using nlohmann::ordered_json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

fs::path source_dir() { return fs::path(KVGRAPH_SOURCE_DIR); }
fs::path tokenizer_dir(const std::string& name) { return source_dir() / "tests/fixtures/tokenizers" / name; }

const char* kTemplate = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant]{% endif %}";

ordered_json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// A checkpoint directory holding only tokenizer_config.json (and files a test adds).
fs::path config_dir(const kvgraph::testing::TempDir& tmp, const ordered_json& config) {
  kvgraph::testing::write_bytes(tmp.path() / "tokenizer_config.json", config.dump());
  return tmp.path();
}

}  // namespace

TEST(ChatTemplate, FoundInTokenizerConfigAsAString) {
  kvgraph::testing::TempDir tmp;
  auto t = ChatTemplate::from_model_dir(config_dir(tmp, {{"chat_template", kTemplate}, {"bos_token", "<s>"}}));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->origin(), "tokenizer_config.json");
  EXPECT_EQ(t->special_tokens(), (ordered_json{{"bos_token", "<s>"}}));
  EXPECT_EQ(t->render({{"messages", {user("hi")}}, {"add_generation_prompt", true}, {"bos_token", "<s>"}}),
            "<s>[user] hi\n[assistant]");
}

TEST(ChatTemplate, NamedTemplatesPickTheNameOrDefault) {
  kvgraph::testing::TempDir tmp;
  const ordered_json list = {{{"name", "default"}, {"template", "D"}}, {{"name", "tool_use"}, {"template", "T"}}};
  const fs::path dir = config_dir(tmp, {{"chat_template", list}});
  EXPECT_EQ(ChatTemplate::from_model_dir(dir)->render(ordered_json::object()), "D");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir, "tool_use")->render(ordered_json::object()), "T");
  EXPECT_THAT(error_of([&] { ChatTemplate::from_model_dir(dir, "rag"); }),
              HasSubstr("no chat template named \"rag\" (it has: default, tool_use)"));
  // A list without a default: asking for the default is an error, as in transformers.
  kvgraph::testing::TempDir tmp2;
  const fs::path dir2 = config_dir(tmp2, {{"chat_template", {{{"name", "tool_use"}, {"template", "T"}}}}});
  EXPECT_THAT(error_of([&] { ChatTemplate::from_model_dir(dir2); }), HasSubstr("no chat template named \"default\""));
}

TEST(ChatTemplate, TemplateFilesComeFirstAsInTransformers) {
  kvgraph::testing::TempDir tmp;
  const fs::path dir = config_dir(tmp, {{"chat_template", "from config"}, {"eos_token", {{"content", "</s>"}}}});
  kvgraph::testing::write_bytes(dir / "chat_template.jinja", "from file {{ eos_token }}\n");
  fs::create_directories(dir / "additional_chat_templates");
  kvgraph::testing::write_bytes(dir / "additional_chat_templates" / "rag.jinja", "rag");
  auto t = ChatTemplate::from_model_dir(dir);
  EXPECT_EQ(t->origin(), "chat_template.jinja");
  EXPECT_EQ(t->render({{"eos_token", "</s>"}}), "from file </s>");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir, "rag")->render(ordered_json::object()), "rag");
  EXPECT_EQ(t->special_tokens(), (ordered_json{{"eos_token", "</s>"}}));  // {"content": ...} read as the text
}

TEST(ChatTemplate, NoneIsNulloptAndBadFilesAreErrors) {
  kvgraph::testing::TempDir tmp;
  EXPECT_FALSE(ChatTemplate::from_model_dir(tmp.path()).has_value());  // no files at all
  EXPECT_FALSE(ChatTemplate::from_model_dir(config_dir(tmp, {{"bos_token", "<s>"}})).has_value());
  EXPECT_THAT(error_of([&] { ChatTemplate::from_model_dir(config_dir(tmp, {{"chat_template", 3}})); }),
              HasSubstr("\"chat_template\" must be a string or a list of named templates"));
  kvgraph::testing::write_bytes(tmp.path() / "tokenizer_config.json", "{\"chat_template\": ");
  EXPECT_THAT(error_of([&] { ChatTemplate::from_model_dir(tmp.path()); }), HasSubstr("not valid JSON"));
  kvgraph::testing::write_bytes(tmp.path() / "tokenizer_config.json", std::string(100, '[') + std::string(100, ']'));
  EXPECT_THAT(error_of([&] { ChatTemplate::from_model_dir(tmp.path()); }), HasSubstr("nested deeper"));
  // A syntax error names where the template came from and its line.
  config_dir(tmp, {{"chat_template", "ok\n{% if %}"}});
  EXPECT_THAT(error_of([&] { ChatTemplate::from_model_dir(tmp.path()); }),
              HasSubstr("[chat_template] tokenizer_config.json line 2: "));
}

TEST(ChatTemplate, RenderConversationPassesWhatTransformersPasses) {
  kvgraph::testing::TempDir tmp;
  const std::string probe =
      "{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}|{{ tools }}|{{ add_generation_prompt }}|"
      "{{ enable_thinking }}|{{ messages|length }}";
  const fs::path dir = config_dir(tmp, {{"chat_template", probe}, {"bos_token", "<s>"}, {"eos_token", "</s>"}});
  auto model = Model::load(source_dir() / "tests/fixtures/models/llama", Device::CPU);
  const Tokenizer tok = Tokenizer::from_file(tokenizer_dir("llama3_bpe"));
  const ordered_json messages = {user("a"), {{"role", "assistant"}, {"content", "b"}}};
  EXPECT_EQ(chat::render_conversation(dir, *model, tok, messages, nullptr, true, {{"enable_thinking", false}}),
            "<s>|</s>|False|None|True|False|2");
  // An empty tools list is passed as none, as transformers passes no tools.
  EXPECT_EQ(chat::render_conversation(dir, *model, tok, messages, ordered_json::array(), false),
            "<s>|</s>|False|None|False||2");
  const ordered_json tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  EXPECT_EQ(chat::render_conversation(dir, *model, tok, messages, tools, false),
            "<s>|</s>|False|[{'type': 'function', 'function': {'name': 'f'}}]|False||2");
  // Extra variables may override the special tokens.
  EXPECT_EQ(chat::render_conversation(dir, *model, tok, messages, nullptr, true, {{"bos_token", "B"}}).substr(0, 2),
            "B|");
  // A template's errors come out with the template's message.
  config_dir(tmp, {{"chat_template", "{{ raise_exception('no ' ~ messages[0].role) }}"}});
  EXPECT_THAT(error_of([&] { chat::render_conversation(dir, *model, tok, messages, nullptr, true); }),
              HasSubstr("[chat_template] tokenizer_config.json line 1: no user"));
}

TEST(ChatTemplate, RenderedBosIsEncodedOnce) {
  // Templates write the BOS as text; encoding without added specials gives
  // exactly one BOS id (the tokenizer would add a second with them).
  const fs::path dir = source_dir() / "models/default";
  const Tokenizer tok = Tokenizer::from_file(dir);
  const ChatTemplate t = ChatTemplate::parse(kTemplate, "test", chat::special_tokens(dir));
  const std::string text = t.render({{"messages", {user("Hello")}}, {"add_generation_prompt", true},
                                     {"bos_token", t.special_tokens()["bos_token"]}});
  ASSERT_EQ(text.rfind("<bos>", 0), 0u) << text;
  const std::vector<int32_t> ids = chat::encode_conversation(tok, text);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], *tok.bos_id());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.bos_id()), 1);
  EXPECT_EQ(tok.encode(text, true).size(), ids.size() + 1);  // what encoding with specials would have done
}

TEST(ChatFormat, FallbackFormatsPerFamily) {
  auto llama = Model::load(source_dir() / "tests/fixtures/models/llama", Device::CPU);
  const ordered_json conversation = {{{"role", "system"}, {"content", "Be brief."}}, user("Hi"),
                                     {{"role", "assistant"}, {"content", "Hello!"}}, user("Bye")};
  struct Case {
    std::string tokenizer, name, text;
  };
  const std::vector<Case> cases = {
      {"llama3_bpe", "llama3",
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
       "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>"
       "\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
      {"qwen2_bpe", "chatml",
       "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
       "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
      {"gemma_bpe", "gemma",
       "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
       "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"},
      {"sp_bpe", "mistral", "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]"},
      {"metaspace_bpe", "plain", "<s>Be brief.\n\nHiHello!\nBye"},
  };
  for (const Case& c : cases) {
    const Tokenizer tok = Tokenizer::from_file(tokenizer_dir(c.tokenizer));
    const chat::ChatFormat f = chat::chat_format(*llama, tok);
    EXPECT_EQ(f.name, c.name) << c.tokenizer;
    // An empty model_dir: no template, so the format renders it.
    EXPECT_EQ(chat::render_conversation({}, *llama, tok, conversation, nullptr, true), c.text) << c.tokenizer;
  }
  const Tokenizer tok = Tokenizer::from_file(tokenizer_dir("qwen2_bpe"));
  EXPECT_THAT(error_of([&] {
                chat::render_conversation({}, *llama, tok, conversation, {{{"type", "function"}}}, true);
              }),
              HasSubstr("no chat template, and tools need one"));
  EXPECT_THAT(error_of([&] {
                chat::render_conversation({}, *llama, tok, {{{"role", "tool"}, {"content", "x"}}}, nullptr, true);
              }),
              HasSubstr("role \"tool\" needs the model's chat template"));
  EXPECT_THAT(error_of([&] { chat::render_conversation({}, *llama, tok, {user("a"), {{"role", "system"}}}, nullptr, true); }),
              HasSubstr("a system message may only come first"));
}

TEST(ChatFormat, EndOfTurnIdsAreThoseTheTokenizerHas) {
  auto llama = Model::load(source_dir() / "tests/fixtures/models/llama", Device::CPU);
  const Tokenizer qwen = Tokenizer::from_file(tokenizer_dir("qwen2_bpe"));
  EXPECT_EQ(chat::end_of_turn_ids(*llama, qwen), std::vector<int32_t>{*qwen.token_to_id("<|im_end|>")});
  const Tokenizer l3 = Tokenizer::from_file(tokenizer_dir("llama3_bpe"));
  EXPECT_EQ(chat::end_of_turn_ids(*llama, l3), std::vector<int32_t>{*l3.token_to_id("<|eot_id|>")});
}
