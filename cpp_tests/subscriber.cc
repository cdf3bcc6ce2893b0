#include "subscriber.h"

#include <zmq.h>

#include <cerrno>
#include <stdexcept>
#include <thread>

namespace kv_events_test {

namespace {

[[noreturn]] void zmq_fail(const char* what) {
  throw std::runtime_error(std::string(what) + ": " + zmq_strerror(zmq_errno()));
}

}  // namespace

namespace {

// Sets the CURVE client options of `socket` from `curve`; false if libzmq refused one.
bool set_curve(void* socket, const CurveKeys& curve) {
  return zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, curve.server_public.data(),
                        curve.server_public.size()) == 0 &&
         zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, curve.public_key.data(),
                        curve.public_key.size()) == 0 &&
         zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, curve.secret_key.data(),
                        curve.secret_key.size()) == 0;
}

}  // namespace

Subscriber::Subscriber(const std::string& endpoint, const CurveKeys* curve)
    : context_(zmq_ctx_new()), socket_(nullptr), monitor_(nullptr) {
  if (context_ == nullptr) zmq_fail("zmq_ctx_new");
  // Each Subscriber has its own context, so one inproc name serves them all.
  const char* monitor = "inproc://subscriber-monitor";
  const int hwm = 1000000;
  const int linger = 0;
  const char* failed = nullptr;
  if ((socket_ = zmq_socket(context_, ZMQ_SUB)) == nullptr) {
    failed = "zmq_socket";
  } else if (zmq_socket_monitor(socket_, monitor, ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0) {
    failed = "zmq_socket_monitor";
  } else if ((monitor_ = zmq_socket(context_, ZMQ_PAIR)) == nullptr ||
             zmq_setsockopt(monitor_, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
             zmq_connect(monitor_, monitor) != 0) {
    failed = "monitor socket";
  } else if (curve != nullptr && !set_curve(socket_, *curve)) {
    failed = "CURVE keys";
  } else if (zmq_setsockopt(socket_, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
             zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
             zmq_setsockopt(socket_, ZMQ_SUBSCRIBE, "", 0) != 0 ||
             zmq_connect(socket_, endpoint.c_str()) != 0) {
    failed = "connect";
  }
  if (failed != nullptr) {
    const std::string error = zmq_strerror(zmq_errno());
    if (monitor_ != nullptr) zmq_close(monitor_);
    if (socket_ != nullptr) zmq_close(socket_);
    zmq_ctx_term(context_);
    throw std::runtime_error("subscriber on " + endpoint + ": " + failed + ": " + error);
  }
}

Subscriber::~Subscriber() {
  if (monitor_ != nullptr) zmq_close(monitor_);
  zmq_close(socket_);
  zmq_ctx_term(context_);
}

void Subscriber::wait_joined() {
  if (monitor_ != nullptr) {
    // A monitor event is two frames: event number and value, then the peer's address.
    const int timeout_ms = 10000;
    if (zmq_setsockopt(monitor_, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms) != 0) {
      zmq_fail("monitor ZMQ_RCVTIMEO");
    }
    int more = 1;
    while (more) {
      zmq_msg_t frame;
      zmq_msg_init(&frame);
      if (zmq_msg_recv(&frame, monitor_, 0) < 0) {
        zmq_msg_close(&frame);
        zmq_fail("no handshake with the publisher within 10 s");
      }
      more = zmq_msg_more(&frame);
      zmq_msg_close(&frame);
    }
    zmq_socket_monitor(socket_, nullptr, 0);
    zmq_close(monitor_);
    monitor_ = nullptr;
  }
  // The subscription follows the handshake to the publisher's I/O thread, which passes it to
  // the PUB socket: far less than this on any machine that completed the handshake.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

namespace {

// The next multipart message of `socket`, or nothing within `timeout`.
std::optional<Message> receive_message(void* socket, std::chrono::milliseconds timeout) {
  const int ms = static_cast<int>(timeout.count());
  if (zmq_setsockopt(socket, ZMQ_RCVTIMEO, &ms, sizeof ms) != 0) zmq_fail("ZMQ_RCVTIMEO");
  Message message;
  int more = 1;
  while (more) {
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, socket, 0) < 0) {
      const int error = zmq_errno();
      zmq_msg_close(&frame);
      if (error == EAGAIN && message.empty()) return std::nullopt;
      if (error == EINTR) continue;
      errno = error;
      zmq_fail("zmq_msg_recv");
    }
    message.emplace_back(static_cast<const char*>(zmq_msg_data(&frame)), zmq_msg_size(&frame));
    more = zmq_msg_more(&frame);
    zmq_msg_close(&frame);
  }
  return message;
}

}  // namespace

std::optional<Message> Subscriber::receive(std::chrono::milliseconds timeout) {
  return receive_message(socket_, timeout);
}

std::vector<Message> Subscriber::receive_all(std::chrono::milliseconds quiet) {
  std::vector<Message> messages;
  while (auto message = receive(quiet)) messages.push_back(std::move(*message));
  return messages;
}

ReplayClient::ReplayClient(const std::string& endpoint)
    : context_(zmq_ctx_new()), socket_(nullptr) {
  if (context_ == nullptr) zmq_fail("zmq_ctx_new");
  const int linger = 0;
  if ((socket_ = zmq_socket(context_, ZMQ_DEALER)) == nullptr ||
      zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
      zmq_connect(socket_, endpoint.c_str()) != 0) {
    const std::string error = zmq_strerror(zmq_errno());
    if (socket_ != nullptr) zmq_close(socket_);
    zmq_ctx_term(context_);
    throw std::runtime_error("replay client on " + endpoint + ": " + error);
  }
}

ReplayClient::~ReplayClient() {
  zmq_close(socket_);
  zmq_ctx_term(context_);
}

void ReplayClient::send(const Message& request) {
  for (size_t i = 0; i < request.size(); ++i) {
    const int flags = i + 1 < request.size() ? ZMQ_SNDMORE : 0;
    if (zmq_send(socket_, request[i].data(), request[i].size(), flags) < 0) zmq_fail("zmq_send");
  }
}

std::optional<Message> ReplayClient::receive(std::chrono::milliseconds timeout) {
  return receive_message(socket_, timeout);
}

}  // namespace kv_events_test
