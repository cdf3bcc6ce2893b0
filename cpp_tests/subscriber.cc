#include "subscriber.h"

#include <zmq.h>

#include <cerrno>
#include <stdexcept>

namespace kv_events_test {

namespace {

[[noreturn]] void zmq_fail(const char* what) {
  throw std::runtime_error(std::string(what) + ": " + zmq_strerror(zmq_errno()));
}

}  // namespace

Subscriber::Subscriber(const std::string& endpoint)
    : context_(zmq_ctx_new()), socket_(nullptr) {
  if (context_ == nullptr) zmq_fail("zmq_ctx_new");
  socket_ = zmq_socket(context_, ZMQ_SUB);
  if (socket_ == nullptr) {
    zmq_ctx_term(context_);
    zmq_fail("zmq_socket");
  }
  const int hwm = 1000000;
  const int linger = 0;
  if (zmq_setsockopt(socket_, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
      zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
      zmq_setsockopt(socket_, ZMQ_SUBSCRIBE, "", 0) != 0 ||
      zmq_connect(socket_, endpoint.c_str()) != 0) {
    const std::string error = zmq_strerror(zmq_errno());
    zmq_close(socket_);
    zmq_ctx_term(context_);
    throw std::runtime_error("subscriber on " + endpoint + ": " + error);
  }
}

Subscriber::~Subscriber() {
  zmq_close(socket_);
  zmq_ctx_term(context_);
}

std::optional<Message> Subscriber::receive(std::chrono::milliseconds timeout) {
  const int ms = static_cast<int>(timeout.count());
  if (zmq_setsockopt(socket_, ZMQ_RCVTIMEO, &ms, sizeof ms) != 0) zmq_fail("ZMQ_RCVTIMEO");
  Message message;
  int more = 1;
  while (more) {
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, socket_, 0) < 0) {
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

std::vector<Message> Subscriber::receive_all(std::chrono::milliseconds quiet) {
  std::vector<Message> messages;
  while (auto message = receive(quiet)) messages.push_back(std::move(*message));
  return messages;
}

}  // namespace kv_events_test
