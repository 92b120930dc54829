#include "core/socket_address.h"

#include <netinet/in.h>

#include <gtest/gtest.h>

namespace kvfabric {
namespace {

std::string RoundTrip(const std::string& address) {
  sockaddr_storage sa = {};
  socklen_t len = 0;
  const Status s = ParseSocketAddress(address, &sa, &len);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? FormatSocketAddress(sa) : std::string();
}

TEST(SocketAddressTest, ParsesAndPrintsIpv4AndIpv6) {
  EXPECT_EQ(RoundTrip("127.0.0.1:0"), "127.0.0.1:0");
  EXPECT_EQ(RoundTrip("10.1.2.3:65535"), "10.1.2.3:65535");
  EXPECT_EQ(RoundTrip("[::1]:4790"), "[::1]:4790");
}

TEST(SocketAddressTest, RefusesAddressesWithoutHostOrPortNamingThem) {
  for (const char* bad : {"127.0.0.1", ":80", "127.0.0.1:", "", "no-such-host.invalid:1",
                          "127.0.0.1:http"}) {
    sockaddr_storage sa = {};
    socklen_t len = 0;
    const Status s = ParseSocketAddress(bad, &sa, &len);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(std::string("\"") + bad + "\""), std::string::npos) << s;
  }
}

TEST(SocketAddressTest, UnknownFamilyPrintsUnknown) {
  sockaddr_storage sa = {};
  sa.ss_family = AF_UNIX;
  EXPECT_EQ(FormatSocketAddress(sa), "unknown");
}

TEST(SocketAddressTest, AddressListsSplitAtCommasAndRefuseEmptyEntriesAndTooMany) {
  auto two = SplitAddressList(" a:1 ,b:2", "--x", 8);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<std::string>{"a:1", "b:2"}));
  auto empty = SplitAddressList("a:1,,b:2", "--x", 8);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("--x \"a:1,,b:2\" has an empty entry"),
            std::string::npos);
  auto many = SplitAddressList("a:1,b:2,c:3", "--x", 2);
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("3 replicas; at most 2"), std::string::npos);
}

}  // namespace
}  // namespace kvfabric
