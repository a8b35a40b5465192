// kvgraph chat with a chat template: the embedded default model in a
// directory that also holds a chat_template.jinja (or with --template), so
// that the text the model sees is known and `generate` on that same text
// is the reference for the reply.
#include <unistd.h>

#include <filesystem>
#include <regex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/files.h"
#include "support/run.h"
#include "support/temp_dir.h"

using namespace kvgraph::testing;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

namespace {

const fs::path kDefault = fs::path(KVGRAPH_SOURCE_DIR) / "models" / "default";

// "role: content" lines, then "assistant:" to open the reply.
const char* kTemplate =
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}";

// The default model's files in `dir`, with `template_text` as its chat_template.jinja (none when empty).
fs::path model_with_template(const TempDir& tmp, const std::string& template_text) {
  const fs::path dir = tmp.path() / "model";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    fs::create_symlink(kDefault / f, dir / f);
  if (!template_text.empty()) write_bytes(dir / "chat_template.jinja", template_text);
  return dir;
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// The reply of a one-message chat: stdout is "> " REPLY "\n" "> " "\n".
std::string only_reply(const RunResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, EndsWith("\n> \n"));
  return r.out.size() < 6 ? "" : r.out.substr(2, r.out.size() - 6);
}

// generate's greedy continuation of `prompt` (the model adds the BOS).
std::string generated(const std::string& prompt, int n) {
  // One file per test process: ctest runs this suite's tests side by side.
  const fs::path file =
      fs::temp_directory_path() / ("kvgraph_chat_template_prompt_" + std::to_string(getpid()) + ".txt");
  write_bytes(file, prompt);
  RunResult g = run_cli("generate --greedy -q -n " + std::to_string(n) + " -f " + quoted(file));
  fs::remove(file);
  EXPECT_EQ(g.exit_code, 0) << g.err;
  return g.out.empty() ? "" : g.out.substr(0, g.out.size() - 1);
}

std::vector<int> prefilled(const std::string& err) {
  std::vector<int> n;
  static const std::regex re(R"(turn: prefilled (\d+) new tokens)");
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it) n.push_back(std::stoi((*it)[1]));
  return n;
}

}  // namespace

TEST(CliChatTemplate, TheCheckpointsTemplateShapesWhatTheModelSees) {
  TempDir tmp;
  const fs::path dir = model_with_template(tmp, kTemplate);
  RunResult r = run_cli_with_input("chat --temperature 0 -n 16 -m " + quoted(dir), "Once upon a time\n");
  EXPECT_THAT(r.err, HasSubstr("chat template from chat_template.jinja"));
  EXPECT_EQ(only_reply(r), generated("user: Once upon a time\nassistant:", 16));
}

TEST(CliChatTemplate, EachTurnRendersTheWholeConversationAndPrefillsOnlyWhatIsNew) {
  TempDir tmp;
  const fs::path dir = model_with_template(tmp, kTemplate);
  RunResult r = run_cli_with_input("chat --temperature 0 -n 8 -m " + quoted(dir) + " --system 'Be kind.'",
                                   "Hello\nA computer is\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // stdout: "> " REPLY1 "\n> " REPLY2 "\n> \n" (replies may hold newlines).
  ASSERT_EQ(r.out.rfind("> ", 0), 0u) << r.out;
  ASSERT_THAT(r.out, EndsWith("\n> \n"));
  const size_t split = r.out.find("\n> ", 2);
  ASSERT_LT(split, r.out.size() - 4) << r.out;
  const std::string first = r.out.substr(2, split - 2);
  const std::string second = r.out.substr(split + 3, r.out.size() - 4 - (split + 3));
  EXPECT_EQ(first, generated("system: Be kind.\nuser: Hello\nassistant:", 8));
  // The second turn is the template's rendering of all of it.
  EXPECT_EQ(second,
            generated("system: Be kind.\nuser: Hello\nassistant: " + first + "\nuser: A computer is\nassistant:", 8));
  // ...of which only the tail after the cached prefix is prefilled.
  const auto n = prefilled(r.err);
  ASSERT_EQ(n.size(), 2u) << r.err;
  EXPECT_LT(n[1], n[0] + 10) << r.err;
}

TEST(CliChatTemplate, TemplateFileNameAndVariablesFromTheCommandLine) {
  TempDir tmp;
  const fs::path dir = model_with_template(tmp, "");
  write_bytes(tmp.path() / "t.jinja", "{{ bos_token }}{{ greeting }}, {{ messages[-1].content }}");
  RunResult r = run_cli_with_input("chat --temperature 0 -n 10 -m " + quoted(dir) + " --template " +
                                       quoted(tmp.path() / "t.jinja") + " --template-var greeting='\"Dear\"'",
                                   "Once upon a time\n");
  EXPECT_THAT(r.err, HasSubstr("t.jinja"));
  EXPECT_EQ(only_reply(r), generated("Dear, Once upon a time", 10));

  // A named template of tokenizer_config.json.
  nlohmann::json cfg = nlohmann::json::parse(read_file(kDefault / "tokenizer_config.json"));
  cfg["chat_template"] = {{{"name", "default"}, {"template", "{{ bos_token }}D {{ messages[-1].content }}"}},
                          {{"name", "story"}, {"template", "{{ bos_token }}Story: {{ messages[-1].content }}"}}};
  fs::remove(dir / "tokenizer_config.json");
  write_bytes(dir / "tokenizer_config.json", cfg.dump());
  RunResult named = run_cli_with_input("chat --temperature 0 -n 10 --template-name story -m " + quoted(dir),
                                       "Once upon a time\n");
  EXPECT_EQ(only_reply(named), generated("Story: Once upon a time", 10));
  RunResult missing = run_cli_with_input("chat -m " + quoted(dir) + " --template-name nope", "hi\n");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("kvgraph: error: [chat_template]"));
  EXPECT_THAT(missing.err, HasSubstr("no chat template named \"nope\" (it has: default, story)"));
  RunResult both = run_cli_with_input("chat --template a --template-name b", "");
  EXPECT_EQ(both.exit_code, 2) << both.err;
}

TEST(CliChatTemplate, ATemplateErrorRefusesTheMessageAndTheChatGoesOn) {
  TempDir tmp;
  const fs::path dir = model_with_template(
      tmp, std::string("{% if messages[-1].content == 'bad' %}{{ raise_exception('no bad words') }}{% endif %}") +
               kTemplate);
  RunResult r = run_cli_with_input("chat --temperature 0 -n 6 -m " + quoted(dir), "bad\nOnce upon a time\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kvgraph: error: [chat_template] chat_template.jinja line 1: no bad words; not sent, "
                               "the conversation is kept"));
  EXPECT_EQ(prefilled(r.err).size(), 1u) << r.err;  // the second message was answered
  EXPECT_THAT(r.out, EndsWith(generated("user: Once upon a time\nassistant:", 6) + "\n> \n"));
}

TEST(CliChatTemplate, ASystemPromptTheTemplateRefusesOpensTheFirstMessage) {
  TempDir tmp;
  const fs::path dir = model_with_template(
      tmp, std::string("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
                       "{% endif %}") +
               kTemplate);
  RunResult r = run_cli_with_input("chat --temperature 0 -n 8 --system 'Be kind.' -m " + quoted(dir), "Hello\n");
  EXPECT_THAT(r.err, HasSubstr("the chat template refuses a system message"));
  EXPECT_EQ(only_reply(r), generated("user: Be kind.\n\nHello\nassistant:", 8));
}

TEST(CliChatTemplate, PromptCacheKeepsTheCommonPrefixAcrossChats) {
  TempDir tmp;
  const fs::path dir = model_with_template(tmp, kTemplate);
  const fs::path cache = tmp.path() / "chat.kvs";
  const std::string system = " --system 'You are a storyteller who writes about ships, stars and old castles.'";
  const std::string flags = "chat --temperature 0 -n 8 -m " + quoted(dir) + system + " --prompt-cache " + quoted(cache);
  RunResult first = run_cli_with_input(flags, "Once upon a time\n");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_TRUE(fs::exists(cache));
  EXPECT_THAT(first.err, HasSubstr("saved"));
  RunResult again = run_cli_with_input(flags, "A computer is\n");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.err, HasSubstr("prompt cache " + cache.string() + ": restored"));
  RunResult fresh = run_cli_with_input("chat --temperature 0 -n 8 -m " + quoted(dir) + system, "A computer is\n");
  // The restored system prompt is not prefilled again; the reply is the same.
  ASSERT_EQ(prefilled(again.err).size(), 1u) << again.err;
  ASSERT_EQ(prefilled(fresh.err).size(), 1u) << fresh.err;
  EXPECT_LT(prefilled(again.err)[0] + 10, prefilled(fresh.err)[0]) << again.err;
  EXPECT_EQ(again.out, fresh.out);
  // A damaged file is an error, never silently ignored.
  write_bytes(cache, "not a session");
  RunResult bad = run_cli_with_input(flags, "Hello\n");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("kvgraph: error: [session_file]"));
}
