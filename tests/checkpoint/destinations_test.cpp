// Where the checkpoint writers and fsdp-ckpt write (issue 37): a writer
// removes only files it can prove it wrote, writes a sharded checkpoint
// beside a user's other files (as Lightning does, issue 50 item 21) and
// refuses only those under the checkpoint's names, naming them (item 2); it replaces only a regular file, never a
// device, a FIFO or a symbolic link, and follows nothing beneath its output
// directory (item 4); and `fsdp-ckpt verify` checks the run's position that
// an fsdp-train checkpoint keeps (item 10).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "../support/errors.h"
#include "../support/index_files.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/trainer.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

constexpr auto kTool = std::chrono::seconds(60);

CheckpointState state_of(Trainer& t, int64_t step) {
  return CheckpointState().model("model", t.model.ptr()).optimizer("optimizer", *t.optimizer).value("step", step);
}

// Saves a small model (seed `seed`) at `path` in `format`, on one rank.
void save_one(const std::string& path, CheckpointFormat format, uint64_t seed = 1, int64_t step = 5) {
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, seed);
    save_checkpoint(path, state_of(a, step), pg, {format});
  });
}

int64_t saved_step(const std::string& path) {
  int64_t step = -1;
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer b(pg, Opt::kSgd, 9);
    CheckpointState s = state_of(b, 0);
    load_checkpoint(path, s, pg);
    step = s.get<int64_t>("step");
  });
  return step;
}

// A user's files: name -> contents.
const std::map<std::string, std::string> kUserFiles = {
    {"data-train.bin", "the user's training data"},
    {"index.json", "{\"the user's\": \"index\"}"},
    {"__notes.distcp", "the user's notes"},
    {"README", "the user's readme"},
};

void write_user_files(const std::string& dir) {
  fs::create_directories(dir);
  for (const auto& [name, text] : kUserFiles) write_file(dir + "/" + name, text);
}

void expect_user_files_intact(const std::string& dir, const std::string& what) {
  for (const auto& [name, text] : kUserFiles) EXPECT_EQ(read_file(dir + "/" + name), text) << what << ": " << name;
}

std::string kind_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "absent";
  if (S_ISLNK(st.st_mode)) return "symlink";
  if (S_ISFIFO(st.st_mode)) return "fifo";
  if (S_ISCHR(st.st_mode)) return "chardev";
  if (S_ISDIR(st.st_mode)) return "dir";
  return S_ISREG(st.st_mode) ? "file" : "other";
}

}  // namespace

// Issue 37 item 2, as issue 50 item 21 narrowed it. Before issue 37: `fsdp-ckpt
// convert full.pt proj --format sharded` exited 0 and deleted data-train.bin,
// index.json and __notes.distcp from proj (the commit's stale-file pattern
// matched them), keeping only README. Now only the user's files under names
// a sharded checkpoint takes (index.json, *.distcp) refuse it, named; the
// others would stay beside it (the next test).
TEST(CheckpointOwnership, ConvertIntoADirectoryOfTheUsersFilesRefusesOnlyCollidingNames) {
  TempDir dir;
  const std::string full = dir.path() + "/full.ckpt", proj = dir.path() + "/proj";
  save_one(full, CheckpointFormat::kFull);
  write_user_files(proj);
  auto r = run_program({FSDP_CKPT_PATH, "convert", full, proj, "--format", "sharded"}, kTool);
  EXPECT_EQ(r.exit_code(), 2) << r.output;
  EXPECT_NE(r.output.find("holds files that fsdp-cpp did not write under the names a sharded checkpoint takes (" +
                          proj + "/__notes.distcp, " + proj + "/index.json"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find(proj + "/README"), std::string::npos) << "README collides with nothing\n" << r.output;
  expect_user_files_intact(proj, "convert");
  EXPECT_EQ(std::distance(fs::directory_iterator(proj), fs::directory_iterator{}), 4) << "nothing written into proj";
  // Without the colliding two, convert writes beside README and data-train.bin and keeps them.
  fs::remove(proj + "/index.json");
  fs::remove(proj + "/__notes.distcp");
  r = run_program({FSDP_CKPT_PATH, "convert", full, proj, "--format", "sharded"}, kTool);
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(read_file(proj + "/README"), kUserFiles.at("README"));
  EXPECT_EQ(read_file(proj + "/data-train.bin"), kUserFiles.at("data-train.bin"));
  EXPECT_EQ(saved_step(proj), 5);
}

// Issue 50 item 21: Lightning's FSDPStrategy.save_checkpoint(state_dict_type=
// "sharded") into an existing directory holding a user's file writes the
// checkpoint there and keeps the file (its test_save_checkpoint_path_exists).
// Before the fix: "proj holds files that fsdp-cpp did not write (proj/README,
// …)", nothing saved. A full save that would replace a sharded checkpoint's
// directory still refuses while a user's file is in it (Lightning removes the
// directory, the file with it: fsdp-cpp never removes what is not its own).
TEST(CheckpointOwnership, ShardedSaveWritesBesideTheUsersFilesAndKeepsThemAsLightningDoes) {
  TempDir dir;
  const std::string proj = dir.path() + "/proj";
  write_user_files(proj);
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1);
    // The colliding names refuse it, each named; the others are not named.
    expect_config_error([&] { save_checkpoint(proj, state_of(a, 1), pg, {CheckpointFormat::kSharded}); },
                        "(" + proj + "/__notes.distcp, " + proj + "/index.json");
  });
  expect_user_files_intact(proj, "refused sharded save");
  EXPECT_FALSE(fs::exists(proj + "/.metadata"));
  fs::remove(proj + "/index.json");
  fs::remove(proj + "/__notes.distcp");
  save_one(proj, CheckpointFormat::kSharded, 1, 3);  // beside README and data-train.bin
  EXPECT_EQ(read_file(proj + "/README"), kUserFiles.at("README"));
  EXPECT_EQ(read_file(proj + "/data-train.bin"), kUserFiles.at("data-train.bin"));
  EXPECT_EQ(saved_step(proj), 3);
  EXPECT_TRUE(verify_checkpoint(proj).empty());
  // Saved again over itself: the user's files still stay, the new save loads.
  write_file(proj + "/notes.txt", "mine");
  save_one(proj, CheckpointFormat::kSharded, 2, 4);
  EXPECT_EQ(read_file(proj + "/notes.txt"), "mine");
  EXPECT_EQ(read_file(proj + "/README"), kUserFiles.at("README"));
  EXPECT_EQ(saved_step(proj), 4);
  // A foreign file under a checkpoint's own name is never overwritten.
  const std::string other = dir.path() + "/other";
  fs::create_directories(other);
  write_file(other + "/.metadata", "not DCP's");
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1);
    expect_config_error([&] { save_checkpoint(other, state_of(a, 1), pg, {CheckpointFormat::kSharded}); },
                        other + "/.metadata");
  });
  EXPECT_EQ(read_file(other + "/.metadata"), "not DCP's");

  // A full save over our sharded checkpoint that also holds the user's notes.txt: refused, naming it.
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 2);
    expect_config_error([&] { save_checkpoint(proj, state_of(a, 5), pg, {CheckpointFormat::kFull}); },
                        proj + "/notes.txt");
  });
  EXPECT_EQ(read_file(proj + "/notes.txt"), "mine");
  EXPECT_EQ(saved_step(proj), 4);
  // Our own checkpoint alone is replaced by a full save. A leftover of a
  // killed replacement is removed only under a name a replacement gives: a
  // user's ckpt.fsdp-new-notes stays.
  const std::string ckpt = dir.path() + "/ckpt";
  save_one(ckpt, CheckpointFormat::kSharded, 1, 3);
  write_file(dir.path() + "/ckpt.fsdp-new-notes", "kept");
  save_one(ckpt, CheckpointFormat::kFull, 2, 4);
  EXPECT_EQ(read_file(dir.path() + "/ckpt.fsdp-new-notes"), "kept");
  EXPECT_EQ(saved_step(ckpt), 4);
}

// Overwriting our own checkpoint in place keeps working (Lightning's
// save_checkpoint writes into an existing checkpoint directory): the
// previous save's data files, a killed save's data file and temporaries, and
// the earlier layout's index.json go; the new checkpoint loads.
TEST(CheckpointOwnership, OurOwnCheckpointIsStillOverwrittenInPlace) {
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  save_one(ckpt, CheckpointFormat::kSharded, 1, 1);
  std::vector<std::string> first;
  for (const auto& e : fs::directory_iterator(ckpt)) first.push_back(e.path().filename().string());
  // What a killed save leaves: a data file and temporaries with its save id.
  write_file(ckpt + "/__1_18c1f0a9b2e-3fa2c1.distcp", "killed save's data");
  write_file(ckpt + "/.metadata.tmp-18c1f0a9b2e-3fa2c2", "killed");
  write_file(ckpt + "/__0_18c1f0a9b2e-3fa2c1.distcp.tmp-18c1f0a9b2f-1", "killed");
  save_one(ckpt, CheckpointFormat::kSharded, 2, 2);
  EXPECT_EQ(saved_step(ckpt), 2);
  EXPECT_TRUE(verify_checkpoint(ckpt).empty());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ckpt)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names.size(), 4u) << "only .metadata, fsdp_index.json, meta.pt and one data file";
  for (const auto& n : names) {
    if (n.rfind("__", 0) == 0) {
      EXPECT_EQ(std::find(first.begin(), first.end(), n), first.end()) << n << " of the first save";
    }
  }
  // fsdp-ckpt convert over our own checkpoint, too.
  const std::string full = dir.path() + "/full.pt";
  save_one(full, CheckpointFormat::kFull, 3, 7);
  const auto r = run_program({FSDP_CKPT_PATH, "convert", full, ckpt, "--format", "sharded"}, kTool);
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(saved_step(ckpt), 7);
}

// Issue 37 item 4. Before the fix: `fsdp-ckpt export` onto a device node
// exited 0 and replaced the node with a regular file (its temporary was
// renamed over it); so did convert, consolidate and a full save. Each is
// refused now, naming the node, which stays as it was.
TEST(CheckpointDestinations, ADeviceOrAFifoIsNeverReplaced) {
  TempDir dir;
  const std::string full = dir.path() + "/full.pt", sharded = dir.path() + "/sharded";
  save_one(full, CheckpointFormat::kFull);
  save_one(sharded, CheckpointFormat::kSharded);
  std::vector<std::pair<std::string, std::string>> nodes;  // path, kind
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  nodes.emplace_back(fifo, "fifo");
  const std::string dev = dir.path() + "/null";  // a node of /dev/null's device (root only)
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) nodes.emplace_back(dev, "chardev");
  for (const auto& [node, kind] : nodes) {
    const std::vector<std::vector<std::string>> commands = {
        {"export", full, node}, {"convert", sharded, node, "--format", "full"},
        {"consolidate", sharded, node}, {"convert", full, node, "--format", "sharded"}};
    for (const auto& c : commands) {
      std::vector<std::string> argv{FSDP_CKPT_PATH};
      argv.insert(argv.end(), c.begin(), c.end());
      const auto r = run_program(argv, kTool);
      EXPECT_EQ(r.exit_code(), 2) << c[0] << " onto a " << kind << "\n" << r.output;
      EXPECT_NE(r.output.find(node + " is a"), std::string::npos) << c[0] << "\n" << r.output;
      EXPECT_EQ(kind_of(node), kind) << c[0] << " replaced the node";
    }
    run_ranks(1, [&](dist::ProcessGroup& pg) {
      Trainer a(pg, Opt::kSgd, 1);
      for (auto format : {CheckpointFormat::kFull, CheckpointFormat::kSharded}) {
        expect_config_error([&] { save_checkpoint(node, state_of(a, 1), pg, {format}); }, node + " is a");
      }
    });
    EXPECT_EQ(kind_of(node), kind) << "save_checkpoint replaced the node";
  }
}

// Issue 37 item 4, symbolic links: nothing is followed or replaced where one
// of our files belongs, for every file fsdp-ckpt and the writers write:
// export's, convert's and consolidate's output file, a full save's file,
// and in a sharded directory .metadata, fsdp_index.json, meta.pt and a data
// file. Before the fix: each link was replaced by the new file (the
// renamed temporary); the sharded directory's were replaced or, for a data
// file's name, deleted (the stale-file pattern).
TEST(CheckpointDestinations, ASymbolicLinkWhereOurFileBelongsIsRefusedByName) {
  TempDir dir;
  const std::string full = dir.path() + "/full.pt", sharded = dir.path() + "/sharded";
  save_one(full, CheckpointFormat::kFull);
  save_one(sharded, CheckpointFormat::kSharded);
  const std::string victim = dir.path() + "/victim";
  write_file(victim, "the victim");
  const std::string link = dir.path() + "/link";
  fs::create_symlink(victim, link);
  for (const std::vector<std::string>& c : std::vector<std::vector<std::string>>{
           {"export", full, link}, {"convert", sharded, link, "--format", "full"}, {"consolidate", sharded, link}}) {
    std::vector<std::string> argv{FSDP_CKPT_PATH};
    argv.insert(argv.end(), c.begin(), c.end());
    const auto r = run_program(argv, kTool);
    EXPECT_EQ(r.exit_code(), 2) << c[0] << "\n" << r.output;
    EXPECT_NE(r.output.find(link + " is a symbolic link"), std::string::npos) << c[0] << "\n" << r.output;
  }
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1);
    expect_config_error([&] { save_checkpoint(link, state_of(a, 1), pg, {CheckpointFormat::kFull}); },
                        link + " is a symbolic link");
    expect_config_error([&] { save_checkpoint(link, state_of(a, 1), pg, {CheckpointFormat::kSharded}); },
                        link + " is a symbolic link");
  });
  EXPECT_EQ(kind_of(link), "symlink");
  // Inside a sharded output directory: a link at each name a save writes.
  for (const std::string name : {".metadata", "fsdp_index.json", "meta.pt", "__0_18c1f0a9b2e-3fa2c1.distcp"}) {
    const std::string out = dir.path() + "/out-" + name;
    fs::create_directories(out);
    fs::create_symlink(victim, out + "/" + name);
    const auto r = run_program({FSDP_CKPT_PATH, "convert", full, out, "--format", "sharded"}, kTool);
    EXPECT_EQ(r.exit_code(), 2) << name << "\n" << r.output;
    EXPECT_NE(r.output.find(out + "/" + name + " (a symbolic link)"), std::string::npos) << r.output;
    EXPECT_EQ(kind_of(out + "/" + name), "symlink") << name;
    run_ranks(1, [&](dist::ProcessGroup& pg) {
      Trainer a(pg, Opt::kSgd, 1);
      expect_config_error([&] { save_checkpoint(out, state_of(a, 1), pg, {CheckpointFormat::kSharded}); },
                          out + "/" + name + " (a symbolic link)");
    });
    EXPECT_EQ(kind_of(out + "/" + name), "symlink") << name;
  }
  EXPECT_EQ(read_file(victim), "the victim");
  // The output directory itself may be a symbolic link (to a directory).
  fs::create_directories(dir.path() + "/real");
  fs::create_symlink(dir.path() + "/real", dir.path() + "/dirlink");
  const auto r = run_program({FSDP_CKPT_PATH, "convert", full, dir.path() + "/dirlink", "--format", "sharded"}, kTool);
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(fs::exists(dir.path() + "/real/.metadata"));
}

// Issue 37 item 10. Before the fix: `fsdp-ckpt verify` said "ok" to an
// fsdp-train checkpoint whose resealed index held samples = 9.2e18,
// world = 0, step = -3 or step = 1e12.
TEST(FsdpCkptTool, VerifyChecksTheRunsPositionInAnFsdpTrainCheckpoint) {
  TempDir dir;
  const std::string run = dir.path() + "/run";
  auto r = run_program({FSDP_TRAIN_PATH, "--preset", "tiny", "--steps", "2", "--batch", "2", "--log-every", "100",
                        "--eval-every", "0", "--out", run},
                       std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const std::string good = run + "/checkpoints/step-00000002";
  struct Case {
    std::string name;
    nlohmann::json type, value;
    std::string says;  // empty: verify says ok
  };
  const std::vector<Case> cases = {
      {"step", "int", 2, ""},  // the untouched values (meta.pt removed, as in every case)
      {"samples", "int", 9200000000000000000LL, "the run's 'samples' = 9200000000000000000 does not fit 'step' = 2"},
      {"world", "int", 0, "the run's 'world' = 0 is out of range"},
      {"step", "int", -3, "the run's 'step' = -3 is negative"},
      {"step", "int", 1000000000000LL, "the run's 'step' = 1000000000000 is beyond the steps of the job"},
      {"samples", "int", -1, "the run's 'samples' = -1 is negative"},
      {"samples", "int", 2, "the run's 'samples' = 2 does not fit"},  // at least 2 x 1 for step 2, 1 for step 1
      {"samples", "float", 4.0, "the run's 'samples' is a float ("},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string p = dir.path() + "/case" + std::to_string(n++);
    fs::copy(good, p, fs::copy_options::recursive);
    auto j = nlohmann::ordered_json::parse(read_file(p + "/fsdp_index.json"));
    bool found = false;
    for (auto& e : j["entries"]) {
      if (e["name"] != c.name) continue;
      e["type"] = c.type;
      e["value"] = c.value;
      found = true;
    }
    ASSERT_TRUE(found) << c.name;
    write_file(p + "/fsdp_index.json", j.dump(1));
    reseal(p + "/fsdp_index.json");
    fs::remove(p + "/meta.pt");  // (its values would disagree with the index: a check of its own)
    const auto v = run_program({FSDP_CKPT_PATH, "verify", p}, kTool);
    const std::string what = c.name + " = " + c.value.dump();
    if (c.says.empty()) {
      EXPECT_EQ(v.exit_code(), 0) << what << "\n" << v.output;
    } else {
      EXPECT_EQ(v.exit_code(), 1) << what << "\n" << v.output;
      EXPECT_NE(v.output.find(c.says), std::string::npos) << what << "\n" << v.output;
    }
  }
}
