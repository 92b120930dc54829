#include "core/socket_owner.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

namespace kvfabric {
namespace {

sockaddr_storage V4(const char* ip, std::uint16_t port) {
  sockaddr_storage sa{};
  auto* in = reinterpret_cast<sockaddr_in*>(&sa);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  inet_pton(AF_INET, ip, &in->sin_addr);
  return sa;
}

sockaddr_storage V6(const char* ip, std::uint16_t port) {
  sockaddr_storage sa{};
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
  in6->sin6_family = AF_INET6;
  in6->sin6_port = htons(port);
  inet_pton(AF_INET6, ip, &in6->sin6_addr);
  return sa;
}

// Lines as Linux 6.x prints them (x86, little endian): a listener on
// 127.0.0.1:8080, the server's accepted socket, the client's socket
// 127.0.0.1:40000 -> :8080 owned by uid 1000, and a TIME_WAIT entry for the
// same client address (uid 0, as TIME_WAIT entries always show) that must not
// be taken for it.
constexpr char kTcp[] =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode\n"
    "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
    "100 1 0000000000000000 100 0 0 10 0\n"
    "   1: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 "
    "101 1 0000000000000000 20 4 30 10 -1\n"
    "   2: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 "
    "102 1 0000000000000000 20 4 30 10 -1\n"
    "   3: 0100007F:9C40 0100007F:1F91 06 00000000:00000000 03:00001770 00000000     0        0 "
    "0 3 0000000000000000\n";

TEST(SocketOwnerTest, FindsTheEstablishedClientSocketInTheIpv4Table) {
  StatusOr<std::uint32_t> owner =
      SocketOwnerInProcNetTcp(kTcp, false, V4("127.0.0.1", 40000), 8080);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_EQ(*owner, 1000u);
  // The same client connected to another port is only in TIME_WAIT.
  EXPECT_EQ(SocketOwnerInProcNetTcp(kTcp, false, V4("127.0.0.1", 40000), 8081).status().code(),
            StatusCode::kNotFound);
  // Nor is a listening socket (state 0A) an owner.
  EXPECT_EQ(SocketOwnerInProcNetTcp(kTcp, false, V4("127.0.0.1", 8080), 0).status().code(),
            StatusCode::kNotFound);
}

TEST(SocketOwnerTest, FindsMappedAndPlainIpv6Peers) {
  // ::ffff:127.0.0.1 port 40000 -> port 8080, uid 7; ::1 port 40001 -> 8080, uid 8.
  const char tcp6[] =
      "  sl  local_address                         remote_address                        st "
      "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      "   0: 0000000000000000FFFF00000100007F:9C40 0000000000000000FFFF00000100007F:1F90 01 "
      "00000000:00000000 00:00000000 00000000     7        0 200 1\n"
      "   1: 00000000000000000000000001000000:9C41 00000000000000000000000001000000:1F90 01 "
      "00000000:00000000 00:00000000 00000000     8        0 201 1\n";
  StatusOr<std::uint32_t> mapped =
      SocketOwnerInProcNetTcp(tcp6, true, V4("127.0.0.1", 40000), 8080);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(*mapped, 7u);
  StatusOr<std::uint32_t> plain = SocketOwnerInProcNetTcp(tcp6, true, V6("::1", 40001), 8080);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(*plain, 8u);
  EXPECT_FALSE(SocketOwnerInProcNetTcp(tcp6, false, V6("::1", 40001), 8080).ok());
}

TEST(SocketOwnerTest, TwoOwnersForOneAddressAreNotAttributed) {
  const std::string twice = std::string(kTcp) +
                            "   4: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 "
                            "00000000  1001        0 103 1\n";
  EXPECT_EQ(SocketOwnerInProcNetTcp(twice, false, V4("127.0.0.1", 40000), 8080).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(SocketOwnerTest, LoopbackAndInterfaceAddressesAreThisHost) {
  EXPECT_TRUE(AddressIsOnThisHost(V4("127.0.0.1", 1)));
  EXPECT_TRUE(AddressIsOnThisHost(V4("127.3.2.1", 1)));
  EXPECT_TRUE(AddressIsOnThisHost(V6("::1", 1)));
  EXPECT_TRUE(AddressIsOnThisHost(V6("::ffff:127.0.0.1", 1)));
  EXPECT_FALSE(AddressIsOnThisHost(V4("192.0.2.1", 1)));  // TEST-NET-1, never assigned
  sockaddr_storage unix_family{};
  unix_family.ss_family = AF_UNIX;
  EXPECT_FALSE(AddressIsOnThisHost(unix_family));
}

// A listener on 127.0.0.1:0; returns its fd and port.
int Listen(std::uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage sa = V4("127.0.0.1", 0);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sockaddr_in)) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *port = ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
  return fd;
}

TEST(SocketOwnerTest, ARealConnectionIsAttributedToThisProcessUser) {
  std::uint16_t port = 0;
  const int listener = Listen(&port);
  ASSERT_GE(listener, 0);
  const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage to = V4("127.0.0.1", port);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&to), sizeof(sockaddr_in)), 0);
  const int server = accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  sockaddr_storage from{};
  socklen_t len = sizeof(from);
  ASSERT_EQ(getpeername(server, reinterpret_cast<sockaddr*>(&from), &len), 0);
  StatusOr<std::uint32_t> owner = TcpPeerSocketOwner(from, port);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_EQ(*owner, geteuid());
  close(client);
  close(server);
  close(listener);
}

TEST(SocketOwnerTest, APeerOfAnotherUserIsAttributedToThatUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another user (CI is root)";
  std::uint16_t port = 0;
  const int listener = Listen(&port);
  ASSERT_GE(listener, 0);
  int done[2];
  ASSERT_EQ(pipe(done), 0);
  const pid_t pid = fork();
  if (pid == 0) {  // nobody: connect, then hold the connection until told
    close(done[1]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage to = V4("127.0.0.1", port);
    if (connect(c, reinterpret_cast<sockaddr*>(&to), sizeof(sockaddr_in)) != 0) _exit(4);
    char byte;
    (void)!read(done[0], &byte, 1);
    _exit(0);
  }
  close(done[0]);
  pollfd p{listener, POLLIN, 0};
  if (poll(&p, 1, 10'000) != 1) {  // the child could not switch user or connect
    close(done[1]);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    FAIL() << "no connection from the child within 10 s; its wait status " << wstatus;
  }
  const int server = accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  sockaddr_storage from{};
  socklen_t len = sizeof(from);
  ASSERT_EQ(getpeername(server, reinterpret_cast<sockaddr*>(&from), &len), 0);
  StatusOr<std::uint32_t> owner = TcpPeerSocketOwner(from, port);
  close(done[1]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_EQ(*owner, 65534u);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  close(server);
  close(listener);
}

}  // namespace
}  // namespace kvfabric
