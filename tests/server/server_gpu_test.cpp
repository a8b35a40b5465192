// The server on a CUDA model: --parallel 2 with concurrent clients, the slots
// taking turns (TurnLock) while they record and re-record their decode
// graphs (ignore_eos changes the banned tokens, which records the step
// again). Every answer must equal Session::generate on a fresh CUDA session.
// Skips without a device.
#include <future>

#include <gtest/gtest.h>

#include "ops/cuda/runtime.h"
#include "support/test_server.h"

using namespace kvgraph;
using namespace kvgraph::testing;

namespace {

server::ServedModel load_default_cuda() {
  static std::shared_ptr<const Model> m = Model::load(default_model_path(), Device::CUDA);
  return server::ServedModel::make(m, check_vocab(Tokenizer::from_file(default_model_path() / "tokenizer.json"), m->config()),
                                   "default");
}

std::string direct_cuda(const std::string& prompt, int max_tokens, bool ignore_eos) {
  auto m = load_default_cuda();
  Session s(m.model, {.capacity = 1024, .kv_storage = DType::BF16});
  auto r = s.generate(m.tokenizer.encode(prompt, true), &m.tokenizer, {.max_tokens = max_tokens, .ignore_eos = ignore_eos});
  return r.text;
}

}  // namespace

TEST(ServerGpu, ConcurrentSlotsTakeTurnsAndAnswerAsAlone) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  server::ServerOptions o;
  o.parallel = 2;
  o.session.kv_storage = DType::BF16;
  TestServer ts(o, load_default_cuda);
  const std::string prompts[] = {"Once upon a time", "A wise man once said", "The secret of life",
                                 "Never trust a computer"};
  for (int round = 0; round < 3; ++round) {
    std::vector<std::future<std::pair<std::string, std::string>>> answers;
    for (int i = 0; i < 4; ++i) {
      const std::string p = prompts[(i + round) % 4];
      const bool ignore_eos = (i + round) % 2 == 0;
      const bool stream = i % 2 == 1;
      answers.push_back(std::async(std::launch::async, [&ts, p, ignore_eos, stream] {
        const ojson body = {{"prompt", p}, {"max_tokens", 96}, {"temperature", 0}, {"ignore_eos", ignore_eos},
                            {"stream", stream}};
        std::string text;
        if (!stream) {
          Reply r = ts.post("/v1/completions", body);
          EXPECT_EQ(r.status, 200) << r.body;
          text = r.json["choices"][0]["text"];
        } else {
          for (const auto& d : sse_data(ts.stream("/v1/completions", body).body))
            if (d != "[DONE]") text += ojson::parse(d)["choices"][0]["text"].get<std::string>();
        }
        return std::make_pair(text, direct_cuda(p, 96, ignore_eos));
      }));
    }
    for (auto& a : answers) {
      auto [got, want] = a.get();
      EXPECT_EQ(got, want) << "round " << round;
    }
  }
  EXPECT_EQ(ts.metric("kvgraph_completions_total"), 12);
}
