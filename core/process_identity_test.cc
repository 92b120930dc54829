#include "core/process_identity.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace kvfabric {
namespace {

ProcessIdentity Same() {
  ProcessIdentity id;
  id.boot_id = "0f5e-boot";
  id.uid = 1000;
  id.gid = 1000;
  id.ipc_namespace = 4026531839;
  return id;
}

TEST(ProcessIdentityTest, ThisProcessIsDescribed) {
  const ProcessIdentity id = LocalProcessIdentity();
  EXPECT_EQ(id.uid, geteuid());
  EXPECT_EQ(id.gid, getegid());
  // Linux always has these; a container without /proc would leave them empty.
  EXPECT_FALSE(id.boot_id.empty());
  EXPECT_NE(id.ipc_namespace, 0u);
  EXPECT_TRUE(SharedMemoryReachable(id, id).ok());
}

TEST(ProcessIdentityTest, OneHostOneUserOneNamespaceShares) {
  EXPECT_TRUE(SharedMemoryReachable(Same(), Same()).ok());
  ProcessIdentity other_group = Same();
  other_group.gid = 7;  // the user decides (CMA needs the same user, not group)
  EXPECT_TRUE(SharedMemoryReachable(Same(), other_group).ok());
}

TEST(ProcessIdentityTest, AnotherUserOnTheSameHostIsRefusedNamingBothUids) {
  ProcessIdentity daemon = Same();
  daemon.uid = 0;
  ProcessIdentity engine = Same();
  engine.uid = 65534;
  const Status s = SharedMemoryReachable(engine, daemon);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("uid 0"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("uid 65534"), std::string::npos) << s.ToString();
}

TEST(ProcessIdentityTest, AnotherIpcNamespaceIsRefused) {
  ProcessIdentity peer = Same();
  peer.ipc_namespace = 4026532000;
  const Status s = SharedMemoryReachable(Same(), peer);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("IPC namespace"), std::string::npos) << s.ToString();
}

TEST(ProcessIdentityTest, AnotherHostOrAnUnknownPeerIsNotJudged) {
  ProcessIdentity remote = Same();
  remote.boot_id = "another-host";
  remote.uid = 0;
  EXPECT_TRUE(SharedMemoryReachable(Same(), remote).ok());
  ProcessIdentity unknown;  // an older daemon that does not report itself
  EXPECT_TRUE(SharedMemoryReachable(Same(), unknown).ok());
}

TEST(ProcessIdentityTest, ASameUserOnlyListenerRefusesOtherUsersOfItsHostOnly) {
  ProcessIdentity daemon = Same();
  daemon.uid = 0;
  ProcessIdentity engine = Same();
  engine.uid = 65534;
  EXPECT_TRUE(UcxListenerAdmits(engine, daemon).ok()) << "a daemon that admits every user";
  daemon.ucx_same_user_only = true;
  const Status s = UcxListenerAdmits(engine, daemon);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("uid 0"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("uid 65534"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("--shared-memory-peers"), std::string::npos) << s.ToString();
  engine.uid = 0;
  EXPECT_TRUE(UcxListenerAdmits(engine, daemon).ok()) << "its own user";
  engine.uid = 65534;
  engine.boot_id = "another-host";
  EXPECT_TRUE(UcxListenerAdmits(engine, daemon).ok()) << "another host";
}

}  // namespace
}  // namespace kvfabric
