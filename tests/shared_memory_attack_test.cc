// A hostile client on the daemon's host attacks it through shared memory, as
// the probe of issue 17 did: it steers UCX to POSIX (or SysV) shared memory,
// connects to a kvfabric-cached running as root, writes a few blocks, then
// shrinks every shared-memory object it owns (ftruncate to 0; SysV segments
// are removed) and goes on fetching and writing. Before the daemon refused
// such peers, truncating UCX's own FIFO segment killed it inside UCX and every
// tenant's host-memory cache was lost.
//
// The attacker runs as "nobody". The daemon (default --ucx-tls sm,self,tcp,
// default --shared-memory-peers same-user) must refuse its data-plane
// connection before UCX attaches anything, log why once, and go on serving a
// well-behaved client of its own user over shared memory, byte for byte; and
// SIGTERM still ends it cleanly. A process of the daemon's own user is inside
// its trust boundary (it could kill the daemon), see docs/security.md.
//
// Needs root (to run the attacker as another user); skipped otherwise.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/shm.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "core/testing/test_seed.h"
#include "tests/cache_host_test_client.h"
#include "tests/server_process.h"

namespace kvfabric {
namespace {

// Shrinks every POSIX shared-memory object this process holds open (what
// UCX's posix transport and allocator made) to 0 bytes, and removes every
// SysV segment it created. Returns how many it hit.
int ShrinkEverythingShared() {
  int hit = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      const int fd = std::atoi(e->d_name);
      if (fd <= 2) continue;
      char target[512] = {};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(link.c_str(), target, sizeof target - 1) <= 0) continue;
      const std::string t = target;
      if (t.rfind("/dev/shm/", 0) == 0 || t.rfind("/memfd:", 0) == 0) {
        hit += ftruncate(fd, 0) == 0;
      }
    }
    closedir(d);
  }
  // /proc/sysvipc/shm: key shmid perms size cpid ...
  std::ifstream shm("/proc/sysvipc/shm");
  std::string line;
  std::getline(shm, line);  // header
  while (std::getline(shm, line)) {
    std::istringstream f(line);
    long key = 0, id = 0, perms = 0, size = 0, cpid = 0;
    if (f >> key >> id >> perms >> size >> cpid && cpid == getpid()) {
      hit += shmctl(static_cast<int>(id), IPC_RMID, nullptr) == 0;
    }
  }
  return hit;
}

// The attacker: connect with `ucx_tls`, write blocks, shrink what it shared,
// then read and write again. One line per step.
std::string Attack(std::uint64_t seed, const std::string& grpc, const std::string& transport,
                   const std::string& ucx_tls) {
  std::string out;
  auto c = testing::CacheHostTestClient::Create(seed, ucx_tls);
  if (!c.ok()) return "create: " + c.status().ToString();
  const Status attach = (*c)->Attach(grpc, transport);
  out += "attach: " + attach.ToString() + "\n";
  if (!attach.ok()) return out;
  out += "put: " + (*c)->PutBatch(100, 4).ToString() + "\n";
  out += "shrunk: " + std::to_string(ShrinkEverythingShared()) + "\n";
  out += "get after shrinking: " + (*c)->GetBatch({100, 101, 102, 103}).ToString() + "\n";
  out += "put after shrinking: " + (*c)->PutBatch(200, 4).ToString() + "\n";
  return out;
}

// A client of the daemon's own user over shared memory: writes 8 blocks and
// reads them back, every byte compared.
std::string WellBehaved(std::uint64_t seed, const std::string& grpc, const std::string& transport) {
  auto c = testing::CacheHostTestClient::Create(seed, "sm,self,tcp");
  if (!c.ok()) return "create: " + c.status().ToString();
  Status s = (*c)->Attach(grpc, transport);
  if (s.ok()) s = (*c)->PutBatch(0, 8);
  if (s.ok()) s = (*c)->GetBatch({0, 1, 2, 3, 4, 5, 6, 7});
  return s.ok() ? "ok" : s.ToString();
}

class SharedMemoryAttackTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "needs root to run the attacker as another user (CI is root)";
    seed_ = TestSeed(::testing::UnitTest::GetInstance()->current_test_info()->name());
    char tmpl[] = "/tmp/kvf_shm_attack_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    log_ = dir_ + "/cached.log";
    auto d = testing::ServerProcess::Start(
        testing::ServerBinary("KVF_CACHED", "kvfabric-cached"), "cached", dir_,
        {"--host-id=attacked", "--insecure", "--grpc-address=127.0.0.1:0",
         "--transport-address=127.0.0.1:0", "--metrics-address=off", "--lock-memory=off",
         "--log-level=info", "--log-file=" + log_, "--host-pool-bytes=64MiB",
         "--host-page-bytes=2MiB", "--ucx-tls=sm,self,tcp"});
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
  }

  void TearDown() override {
    daemon_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::uint64_t seed_ = 0;
  std::string dir_, log_;
  std::unique_ptr<testing::ServerProcess> daemon_;
};

TEST_P(SharedMemoryAttackTest, AnotherUsersClientIsRefusedAndTheDaemonKeepsServing) {
  const std::string ucx_tls = GetParam();
  const std::string grpc = daemon_->grpc(), transport = daemon_->transport();

  const std::string attack =
      testing::RunInChild(true, [&] { return Attack(seed_, grpc, transport, ucx_tls); });
  std::printf("attacker (uid %u, ucx_tls %s):\n%s", testing::kNobodyUid, ucx_tls.c_str(),
              attack.c_str());
  EXPECT_EQ(attack.rfind("attach: ", 0), 0u) << attack;
  EXPECT_EQ(attack.find("attach: OK"), std::string::npos)
      << "the daemon let a process of another user connect over shared memory:\n"
      << attack;

  ASSERT_EQ(daemon_->WaitExit(std::chrono::milliseconds(0)), -1) << "the daemon died";
  const std::string good =
      testing::RunInChild(false, [&] { return WellBehaved(seed_, grpc, transport); });
  std::printf("well-behaved client (uid 0, sm,self,tcp): %s\n", good.c_str());
  EXPECT_EQ(good, "ok");

  const std::string log = Log();
  EXPECT_NE(log.find("refused a connection from"), std::string::npos) << log;
  EXPECT_NE(log.find("belongs to uid 65534"), std::string::npos) << log;
  EXPECT_NE(log.find("--shared-memory-peers"), std::string::npos) << log;

  daemon_->Kill(SIGTERM);
  EXPECT_EQ(daemon_->WaitExit(std::chrono::seconds(30)), 0) << "SIGTERM did not end it cleanly";
}

INSTANTIATE_TEST_SUITE_P(PosixAndSysv, SharedMemoryAttackTest,
                         ::testing::Values("posix,self,tcp", "sysv,self,tcp"),
                         [](const auto& info) {
                           return std::string(info.param).substr(0, info.param[0] == 'p' ? 5 : 4);
                         });

}  // namespace
}  // namespace kvfabric
