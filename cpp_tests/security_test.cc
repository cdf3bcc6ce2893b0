// Who may read the stream, through the header: the config errors of the four flags (each an
// std::invalid_argument naming its flag, never quoting a key), an admitted CURVE subscriber
// that reads the stream, a subscriber whose key is not on the allow-list that reads nothing
// and is counted, and the mode of an ipc socket file.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "create_error.h"
#include "test_support.h"

namespace {

using namespace kv_events_test;
using kv::Medium;

// A key pair from libzmq, in Z85.
struct KeyPair {
  std::string public_key, secret_key;
};

KeyPair make_key_pair() {
  char public_key[41], secret_key[41];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    throw std::runtime_error("zmq_curve_keypair failed: libzmq without CURVE?");
  }
  return {public_key, secret_key};
}

// A private directory for one test's key files, removed with what it holds.
class KeyDir {
 public:
  KeyDir() {
    char name[] = "/tmp/kvev-keys-XXXXXX";
    if (mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp");
    path_ = name;
  }
  ~KeyDir() {
    for (const std::string& file : files_) unlink(file.c_str());
    for (auto dir = dirs_.rbegin(); dir != dirs_.rend(); ++dir) rmdir(dir->c_str());
    rmdir(path_.c_str());
  }
  KeyDir(const KeyDir&) = delete;
  KeyDir& operator=(const KeyDir&) = delete;

  std::string mkdir(const std::string& name) {
    const std::string dir = path_ + "/" + name;
    ::mkdir(dir.c_str(), 0700);
    dirs_.push_back(dir);
    return dir;
  }

  // Writes `text` to `name` (relative to the directory) and returns its path.
  std::string write(const std::string& name, const std::string& text) {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    files_.push_back(file);
    return file;
  }

  // The two files `kv-events keygen NAME` writes, in its format.
  void keygen(const std::string& name, const KeyPair& pair) {
    write(name + ".key", "curve\n    public-key = \"" + pair.public_key +
                             "\"\n    secret-key = \"" + pair.secret_key + "\"\n");
    write(name + ".pub", "curve\n    public-key = \"" + pair.public_key + "\"\n");
  }

  std::string path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
  std::vector<std::string> files_, dirs_;
};

// A server key pair and one admitted subscriber's, as files in `dir`, with the config of a
// CURVE publisher on a fresh tcp endpoint that admits only that subscriber.
struct CurveSetup {
  explicit CurveSetup(KeyDir& dir) : server(make_key_pair()), admitted(make_key_pair()) {
    dir.keygen("server", server);
    dir.mkdir("allowed");
    dir.keygen("allowed/indexer-a", admitted);
    config = enabled_config();
    config.curve_secret_key_file = dir.path("server.key");
    config.curve_allow = dir.path("allowed");
  }
  CurveKeys keys_of(const KeyPair& client) const {
    return {server.public_key, client.public_key, client.secret_key};
  }
  KeyPair server, admitted;
  kv::Config config;
};

TEST(Security, EachBadFlagIsInvalidArgumentNamingItAndNoKey) {
  KeyDir dir;
  CurveSetup setup(dir);
  const std::string secret = setup.server.secret_key;
  const std::string bad_key =
      dir.write("bad.key", "secret-key = \"" + secret.substr(0, 39) + "~\"\npublic-key = \"" +
                               setup.server.public_key + "\"\n");
  dir.mkdir("empty");

  struct Case {
    const char* flag;
    kv::Config config;
  };
  std::vector<Case> cases;
  auto with = [&](const char* flag, auto change) {
    kv::Config config = enabled_config();
    change(config);
    cases.push_back({flag, config});
  };
  with("kv_events_curve_secret_key_file",
       [](kv::Config& c) { c.curve_secret_key_file = "/nonexistent/kv.key"; });
  with("kv_events_curve_secret_key_file",
       [&](kv::Config& c) { c.curve_secret_key_file = bad_key; });
  with("kv_events_curve_secret_key_file",
       [&](kv::Config& c) { c.curve_secret_key_file = dir.path("server.pub"); });
  with("kv_events_curve_allow", [&](kv::Config& c) { c.curve_allow = dir.path("allowed"); });
  with("kv_events_curve_allow", [&](kv::Config& c) {
    c.curve_secret_key_file = dir.path("server.key");
    c.curve_allow = dir.path("empty");
  });
  with("kv_events_null_allow_addresses", [](kv::Config& c) {
    c.bind_endpoint = "tcp://127.0.0.1:5999";
    c.null_allow_addresses = "10.0.0.1,not-an-address";
  });
  with("kv_events_null_allow_addresses",
       [](kv::Config& c) { c.null_allow_addresses = "127.0.0.1"; });  // an ipc endpoint
  with("kv_events_ipc_mode", [](kv::Config& c) { c.ipc_mode = "0999"; });
  with("kv_events_ipc_mode", [](kv::Config& c) { c.ipc_mode = "\xff"; });  // not UTF-8

  for (const Case& c : cases) {
    const std::string message = create_error<std::invalid_argument>(c.config);
    EXPECT_EQ(message.rfind(c.flag, 0), 0u) << message;
    EXPECT_EQ(message.find(secret.substr(0, 20)), std::string::npos) << message;
  }
}

TEST(Security, AnAdmittedCurveSubscriberReadsTheStream) {
  KeyDir dir;
  CurveSetup setup(dir);
  const CurveKeys keys = setup.keys_of(setup.admitted);
  Session session(setup.config, &keys);
  session.publisher().on_put_commit("t", "k1", "g", {Medium::kCpu, Medium::kDisk});
  session.publisher().on_medium_delta("t", "k1", "g", {Medium::kCpu, Medium::kDisk},
                                      {Medium::kDisk});
  const std::vector<Batch> batches = session.collect();
  ASSERT_FALSE(batches.empty());
  EXPECT_EQ(batches.front().sequence, 0u);
  EXPECT_EQ(summaries(events_of(batches)),
            (std::vector<std::string>{"stored cpu k1", "stored disk k1", "removed cpu k1"}));
  EXPECT_EQ(session.publisher().stats().refused_handshakes, 0u);
}

TEST(Security, ASubscriberNotOnTheListReadsNothingAndIsCounted) {
  KeyDir dir;
  CurveSetup setup(dir);
  const CurveKeys admitted = setup.keys_of(setup.admitted);
  const CurveKeys stranger = setup.keys_of(make_key_pair());
  Session session(setup.config, &admitted);
  Subscriber refused(setup.config.bind_endpoint, &stranger);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (session.publisher().stats().refused_handshakes == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(session.publisher().stats().refused_handshakes, 1u);
  session.publisher().on_put_commit("t", "k", "", {Medium::kCpu});
  EXPECT_EQ(session.collect_events().size(), 1u);
  EXPECT_FALSE(refused.receive(std::chrono::milliseconds(300)).has_value());
  const std::string status = session.publisher().status_json();
  EXPECT_EQ(status.find("\"refused_handshakes\":0"), std::string::npos) << status;
  EXPECT_EQ(status.find(setup.server.secret_key), std::string::npos);
  EXPECT_EQ(session.publisher().metrics_text().find(setup.server.secret_key), std::string::npos);
}

TEST(Security, AnIpcSocketFileHasTheConfiguredMode) {
  kv::Config config = enabled_config();
  config.ipc_mode = "0600";
  const auto publisher = kv::Publisher::create(config);
  struct stat st {};
  const std::string path = config.bind_endpoint.substr(std::string("ipc://").size());
  ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

}  // namespace
