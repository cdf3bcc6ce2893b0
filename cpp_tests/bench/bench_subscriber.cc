#include "bench_subscriber.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kv_events_bench {
namespace {

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// How long the subscriber waits for a sequence it was told to expect, counted from the
// last message that arrived (a sequence lost at the publisher's high-water mark never comes),
// unless the command says otherwise.
constexpr uint64_t kGiveUpMs = 1000;

// How long one turn of the subscriber's loop waits for a message while a command is pending.
constexpr long kTurnMs = 20;

// The number of events in a batch payload `[timestamp_ms, [event, ...], dp_rank]`, read from
// the array headers only; -1 when the payload does not start that way.
int64_t events_in_payload(const uint8_t* p, size_t size) {
  const uint8_t* end = p + size;
  if (size < 3 || *p++ != 0x93) return -1;
  const uint8_t t = *p++;  // timestamp: any msgpack uint
  if (t <= 0x7f) {
  } else if (t == 0xcc) {
    p += 1;
  } else if (t == 0xcd) {
    p += 2;
  } else if (t == 0xce) {
    p += 4;
  } else if (t == 0xcf) {
    p += 8;
  } else {
    return -1;
  }
  if (p >= end) return -1;
  const uint8_t a = *p++;
  if ((a & 0xf0) == 0x90) return a & 0x0f;
  if (a == 0xdc && end - p >= 2) return (int64_t{p[0]} << 8) | p[1];
  if (a == 0xdd && end - p >= 4) {
    return (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | p[3];
  }
  return -1;
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// The subscriber's state: the counts since the last SYNC and the command it is working on.
class Counter {
 public:
  explicit Counter(void* socket) : socket_(socket) {}

  // Takes every message waiting on the socket (at most `limit`): how many it took.
  int receive_available(int limit) {
    int taken = 0;
    while (taken < limit) {
      zmq_msg_t frames[3];
      int count = 0;
      bool more = true;
      bool bad = false;
      while (more) {
        zmq_msg_t frame;
        zmq_msg_init(&frame);
        const int flags = count == 0 ? ZMQ_DONTWAIT : 0;  // the rest of a message is there
        if (zmq_msg_recv(&frame, socket_, flags) < 0) {
          zmq_msg_close(&frame);
          if (zmq_errno() == EINTR) continue;
          if (count == 0) return taken;  // EAGAIN: nothing more
          bad = true;
          break;
        }
        more = zmq_msg_more(&frame) != 0;
        if (count < 3) {
          frames[count] = frame;
        } else {
          zmq_msg_close(&frame);
          bad = true;
        }
        ++count;
      }
      if (count != 3) bad = true;
      if (!bad && zmq_msg_size(&frames[1]) != 8) bad = true;
      if (!bad) {
        const auto* s = static_cast<const uint8_t*>(zmq_msg_data(&frames[1]));
        uint64_t sequence = 0;
        for (int i = 0; i < 8; ++i) sequence = (sequence << 8) | s[i];
        const auto* payload = static_cast<const uint8_t*>(zmq_msg_data(&frames[2]));
        const size_t size = zmq_msg_size(&frames[2]);
        const int64_t events = events_in_payload(payload, size);
        if (events < 0) bad = true;
        account(sequence, events < 0 ? 0 : static_cast<uint64_t>(events), size);
      }
      if (bad) ++counts_.bad;
      for (int i = 0; i < count && i < 3; ++i) zmq_msg_close(&frames[i]);
      ++taken;
    }
    return taken;
  }

  void account(uint64_t sequence, uint64_t events, size_t size) {
    const uint64_t now = monotonic_ns();
    if (!joined_) {
      joined_ = true;
      write_all(STDOUT_FILENO, "JOINED\n");
    }
    if (have_next_) {
      if (sequence > next_) counts_.missing += sequence - next_;
      if (sequence < next_) ++counts_.restarts;
    }
    have_next_ = true;
    next_ = sequence + 1;
    ++counts_.messages;
    counts_.events += events;
    counts_.payload_bytes += size;
    if (size > counts_.max_payload) counts_.max_payload = size;
    if (counts_.first_ns == 0) counts_.first_ns = now;
    counts_.last_ns = now;
    progress_ns_ = now;
    quiet_turns_ = 0;
  }

  // One turn of the loop that took `taken` messages.
  void turned(int taken) {
    if (taken == 0) ++quiet_turns_;
  }

  // Starts working on one command line.
  void command(const std::string& line) {
    uint64_t target = 0;
    uint64_t give_up_ms = kGiveUpMs;
    char verb[16] = {};
    if (std::sscanf(line.c_str(), "%15s %" SCNu64 " %" SCNu64, verb, &target, &give_up_ms) < 1) {
      return;
    }
    const std::string v = verb;
    if (v == "QUIT") {
      quit_ = true;
    } else if (v == "PAUSE") {
      paused_until_ns_ = monotonic_ns() + target * 1000000u;
    } else if (v == "SYNC" || v == "REPORT") {
      pending_ = v;
      target_ = target;
      give_up_ns_ = give_up_ms * 1000000u;
      progress_ns_ = monotonic_ns();
      quiet_turns_ = 0;
    }
  }

  // Finishes the pending command once every sequence below its target arrived (nothing to
  // wait for when the target is 0) or nothing came for too long.
  void settle() {
    if (pending_.empty()) return;
    const bool reached = target_ == 0 || (have_next_ && next_ >= target_);
    // Silence is the give-up time gone by and as many turns of the loop, each of which waited
    // for a message, that found none: a process a busy machine did not run for that long
    // heard no silence, its messages may be waiting in its I/O thread.
    const bool silent = monotonic_ns() - progress_ns_ >= give_up_ns_ &&
                        quiet_turns_ * kTurnMs * 1000000u >= give_up_ns_;
    if (!reached && !silent) return;
    if (pending_ == "SYNC") {
      counts_ = SubscriberCounts();
      // Whatever did not arrive belongs to the phase before: count gaps from the target on.
      if (!have_next_ || next_ < target_) {
        have_next_ = target_ > 0;
        next_ = target_;
      }
      write_all(STDOUT_FILENO, reached ? "SYNCED 1\n" : "SYNCED 0\n");
    } else {
      char text[512];
      std::snprintf(text, sizeof text,
                    "COUNTS %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
                    " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
                    counts_.messages, counts_.events, counts_.missing, counts_.restarts,
                    counts_.bad, counts_.payload_bytes, counts_.max_payload, next_,
                    counts_.first_ns, counts_.last_ns);
      write_all(STDOUT_FILENO, text);
    }
    pending_.clear();
  }

  bool pending() const { return !pending_.empty(); }
  bool paused() const { return monotonic_ns() < paused_until_ns_; }
  bool quit() const { return quit_; }

 private:
  void* socket_;
  SubscriberCounts counts_;
  bool joined_ = false;
  bool have_next_ = false;
  uint64_t next_ = 0;  // one past the last sequence received
  std::string pending_;
  uint64_t target_ = 0;
  uint64_t progress_ns_ = 0;
  uint64_t quiet_turns_ = 0;  // turns of the loop since progress_ns_ that took nothing
  uint64_t give_up_ns_ = kGiveUpMs * 1000000u;
  uint64_t paused_until_ns_ = 0;
  bool quit_ = false;
};

}  // namespace

double SubscriberCounts::delivered_per_second() const {
  if (last_ns <= first_ns) return 0;
  return static_cast<double>(events) * 1e9 / static_cast<double>(last_ns - first_ns);
}

std::vector<std::string> SubscriberOptions::arguments() const {
  std::vector<std::string> args = {"--subscriber", endpoint, "--rcvhwm", std::to_string(rcvhwm)};
  if (!secret_key.empty()) {
    args.insert(args.end(), {"--curve", server_public, public_key, secret_key});
  }
  return args;
}

bool SubscriberOptions::parse(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[0], "--subscriber") != 0) return false;
  endpoint = argv[1];
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rcvhwm") == 0 && i + 1 < argc) {
      rcvhwm = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--curve") == 0 && i + 3 < argc) {
      server_public = argv[++i];
      public_key = argv[++i];
      secret_key = argv[++i];
    } else {
      return false;
    }
  }
  return rcvhwm > 0;
}

int run_subscriber(const SubscriberOptions& options) {
  signal(SIGPIPE, SIG_IGN);
  void* context = zmq_ctx_new();
  void* socket = zmq_socket(context, ZMQ_SUB);
  const int rcvbuf = 4 << 20;
  const int linger = 0;
  const bool curve = !options.secret_key.empty();
  if (zmq_setsockopt(socket, ZMQ_RCVHWM, &options.rcvhwm, sizeof options.rcvhwm) != 0 ||
      zmq_setsockopt(socket, ZMQ_RCVBUF, &rcvbuf, sizeof rcvbuf) != 0 ||
      zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
      (curve && (zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, options.server_public.c_str(),
                                options.server_public.size()) != 0 ||
                 zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, options.public_key.c_str(),
                                options.public_key.size()) != 0 ||
                 zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, options.secret_key.c_str(),
                                options.secret_key.size()) != 0)) ||
      zmq_setsockopt(socket, ZMQ_SUBSCRIBE, "", 0) != 0 ||
      zmq_connect(socket, options.endpoint.c_str()) != 0) {
    std::fprintf(stderr, "kv_events_bench subscriber: %s: %s\n", options.endpoint.c_str(),
                 zmq_strerror(zmq_errno()));
    return 1;
  }
  Counter counter(socket);
  std::string input;
  bool input_open = true;
  while (input_open && !counter.quit()) {
    zmq_pollitem_t items[2] = {{socket, 0, ZMQ_POLLIN, 0}, {nullptr, STDIN_FILENO, ZMQ_POLLIN, 0}};
    const bool paused = counter.paused();
    if (paused) items[0].events = 0;
    const long timeout_ms = counter.pending() || paused ? kTurnMs : 1000;
    if (zmq_poll(items, 2, timeout_ms) < 0 && zmq_errno() != EINTR) break;
    // Take what the socket holds even without an event: zmq_poll is edge-triggered inside.
    counter.turned(paused ? 0 : counter.receive_available(4096));
    if (items[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
      char chunk[256];
      const ssize_t n = read(STDIN_FILENO, chunk, sizeof chunk);
      if (n <= 0) {
        input_open = n < 0 && errno == EINTR;
      } else {
        input.append(chunk, static_cast<size_t>(n));
      }
      size_t newline;
      while ((newline = input.find('\n')) != std::string::npos) {
        counter.command(input.substr(0, newline));
        input.erase(0, newline + 1);
      }
    }
    counter.settle();
  }
  zmq_close(socket);
  zmq_ctx_term(context);
  return 0;
}

SubscriberProcess::SubscriberProcess(const std::string& self_exe,
                                     const SubscriberOptions& options) {
  int to_child[2];
  int from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    throw std::runtime_error("pipe2 failed");
  }
  std::vector<std::string> args = options.arguments();
  args.insert(args.begin(), self_exe);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // posix_spawn (a vfork-style clone in glibc) rather than fork: no copy of this process's
  // page tables, no copy-on-write faults in the parent while the child starts.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  const int error = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  if (error != 0) {
    close(to_child[1]);
    close(from_child[0]);
    throw std::runtime_error(std::string("posix_spawn failed: ") + std::strerror(error));
  }
  to_child_ = to_child[1];
  from_child_ = from_child[0];
}

SubscriberProcess::~SubscriberProcess() {
  send_line("QUIT");
  close(to_child_);
  close(from_child_);
  for (int i = 0; i < 300; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

bool SubscriberProcess::send_line(const std::string& line) {
  const std::string text = line + "\n";
  return write(to_child_, text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

std::string SubscriberProcess::read_line(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd fd = {from_child_, POLLIN, 0};
    const int ready = poll(&fd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return "";
    char chunk[512];
    const ssize_t n = read(from_child_, chunk, sizeof chunk);
    if (n <= 0) return "";
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

bool SubscriberProcess::wait_joined(const std::function<void()>& probe,
                                    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    probe();
    if (read_line(std::chrono::milliseconds(10)) == "JOINED") return true;
  }
  return false;
}

bool SubscriberProcess::sync(uint64_t next) {
  if (!send_line("SYNC " + std::to_string(next))) return false;
  return read_line(std::chrono::seconds(60)) == "SYNCED 1";
}

bool SubscriberProcess::pause(std::chrono::milliseconds duration) {
  return send_line("PAUSE " + std::to_string(duration.count()));
}

SubscriberCounts SubscriberProcess::report(uint64_t next, std::chrono::milliseconds give_up) {
  SubscriberCounts counts;
  if (!send_line("REPORT " + std::to_string(next) + " " + std::to_string(give_up.count()))) {
    return counts;
  }
  // The child answers once it has every sequence below `next` or after `give_up` of silence;
  // a subscriber far behind may take minutes to get there, which is what the caller measures.
  const std::string line = read_line(std::chrono::minutes(10));
  const int fields =
      std::sscanf(line.c_str(),
                  "COUNTS %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                  " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
                  &counts.messages, &counts.events, &counts.missing, &counts.restarts, &counts.bad,
                  &counts.payload_bytes, &counts.max_payload, &counts.next_sequence,
                  &counts.first_ns, &counts.last_ns);
  counts.ok = fields == 10;
  return counts;
}

}  // namespace kv_events_bench
