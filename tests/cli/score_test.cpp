// kvgraph score / perplexity: what they say about bad input. Each failure is
// one printable line on stderr under the command's own component, naming
// where the problem is.
#include <algorithm>
#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "support/files.h"
#include "support/fixtures.h"
#include "support/run.h"
#include "support/temp_dir.h"

using namespace kvgraph::testing;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

namespace {

// Exactly one line, "kvgraph: error: [component] ...", containing `what`,
// every byte of it printable ASCII.
void expect_error_line(const RunResult& r, int exit_code, const std::string& component, const std::string& what) {
  EXPECT_EQ(r.exit_code, exit_code) << r.err;
  EXPECT_EQ(r.err.rfind("kvgraph: error: [" + component + "] ", 0), 0u) << r.err;
  EXPECT_THAT(r.err, HasSubstr(what));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << r.err;
  for (size_t i = 0; i + 1 < r.err.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(r.err[i]);
    EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << int(c) << " at " << i << " of: " << r.err;
  }
  EXPECT_EQ(r.out, "");
}

std::string score(const fs::path& ids) { return "score --ids " + ids.string(); }

}  // namespace

TEST(CliScore, IdsDirectoryIsSaidToBeADirectory) {
  TempDir dir;
  expect_error_line(run_cli(score(dir.path())), 1, "score", dir.path().string() + ": is a directory");
}

TEST(CliScore, BinaryIdsFileNamesTheByteAndEchoesNothingRaw) {
  TempDir dir;
  const fs::path p = dir.path() / "ids.bin";
  write_bytes(p, std::string("1 2 \0\x01\x02 3\n", 11));
  RunResult r = run_cli(score(p));
  expect_error_line(r, 1, "score", "not a text file (byte 0x00 at offset 4)");

  write_bytes(p, "1 2\n3 \xff\xfe 4\n");
  expect_error_line(run_cli(score(p)), 1, "score", "byte 0xff at offset 6 is not ASCII");
}

TEST(CliScore, BadIdsNameTheirLineAndPosition) {
  TempDir dir;
  const fs::path p = dir.path() / "ids.txt";
  write_bytes(p, "1 2 3\n4,5\n\n 6 12x 7\n");
  expect_error_line(run_cli(score(p)), 1, "score", p.string() + " line 4, position 2: \"12x\" is not a token id");

  write_bytes(p, "1 2\n3 -5\n");
  expect_error_line(run_cli(score(p)), 1, "score", p.string() + " line 2, position 2: \"-5\" is not a token id");

  // The embedded model's vocabulary has 4096 ids: 4095 is the last one.
  write_bytes(p, "1 4095\n2 3 4096\n");
  expect_error_line(run_cli(score(p)), 1, "score", p.string() + " line 2, position 3: token id 4096 is out of range");
  EXPECT_THAT(run_cli(score(p)).err, HasSubstr("4096 ids"));

  write_bytes(p, "1\n99999999999999999999999\n");
  expect_error_line(run_cli(score(p)), 1, "score",
                    p.string() + " line 2, position 1: token id 99999999999999999999999 is out of range");

  write_bytes(p, "1 4095\n2 3 4\n");  // all in range: scored
  RunResult ok = run_cli(score(p));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("\"n\":5"));
}

TEST(CliScore, EmptyIdsFileHasNoTokenIds) {
  TempDir dir;
  const fs::path p = dir.path() / "ids.txt";
  write_bytes(p, " \n,\n");
  expect_error_line(run_cli(score(p)), 1, "score", "no token ids");
}

TEST(CliScore, PerplexityErrorsAreUnderPerplexity) {
  TempDir dir;
  const fs::path text = dir.path() / "text.txt";
  std::string words;
  for (int i = 0; i < 200; ++i) words += "the cat sat on the mat. ";
  write_bytes(text, words);
  // A window that cannot fit the cache is a bad command line, found before any work.
  RunResult r = run_cli("perplexity " + text.string() + " --ctx 64 --capacity 32");
  expect_error_line(r, 2, "cli", "--ctx 64");
  EXPECT_THAT(r.err, HasSubstr("--capacity 32"));
  expect_error_line(run_cli("perplexity /nonexistent/text.txt"), 1, "perplexity", "/nonexistent/text.txt: cannot open");
  expect_error_line(run_cli("perplexity " + dir.path().string()), 1, "perplexity", "is a directory");
  // No tokenizer: nothing to say about --prompt-ids, which perplexity does not have.
  RunResult nt = run_cli("perplexity -m " + (fixtures_dir() / "llama").string() + " " + text.string());
  expect_error_line(nt, 1, "perplexity", "no tokenizer.json");
  EXPECT_THAT(nt.err, Not(HasSubstr("--prompt-ids")));
  expect_error_line(run_cli("perplexity " + text.string() + " --ctx 100000"), 1, "perplexity",
                    "fewer than one --ctx window of 100000");
  RunResult ok = run_cli("perplexity " + text.string() + " --ctx 64 -q");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("perplexity "));
}
