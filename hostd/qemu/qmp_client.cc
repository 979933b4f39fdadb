#include "qmp_client.h"

#include <sys/socket.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <future>
#include <utility>

namespace hvtrace::hostd {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
constexpr size_t kReadChunk = 64 * 1024;
constexpr std::chrono::milliseconds kConnectRetry{20};
}  // namespace

std::shared_ptr<QmpClient> QmpClient::Create(asio::any_io_executor executor,
                                             size_t max_message_bytes) {
  return std::shared_ptr<QmpClient>(new QmpClient(std::move(executor), max_message_bytes));
}

QmpClient::QmpClient(asio::any_io_executor executor, size_t max_message_bytes)
    : strand_(asio::make_strand(executor)),
      socket_(strand_),
      connect_deadline_(strand_),
      retry_timer_(strand_),
      framer_(max_message_bytes),
      read_buffer_(kReadChunk) {}

QmpClient::~QmpClient() = default;

void QmpClient::SetEventHandler(EventHandler handler) {
  asio::dispatch(strand_, [self = shared_from_this(), h = std::move(handler)]() mutable {
    self->event_handler_ = std::move(h);
  });
}

void QmpClient::SetDisconnectHandler(DisconnectHandler handler) {
  asio::dispatch(strand_, [self = shared_from_this(), h = std::move(handler)]() mutable {
    self->disconnect_handler_ = std::move(h);
  });
}

void QmpClient::AsyncConnect(std::string socket_path, std::chrono::milliseconds timeout,
                             ConnectHandler handler) {
  asio::dispatch(strand_, [self = shared_from_this(), path = std::move(socket_path), timeout,
                           h = std::move(handler)]() mutable {
    if (self->state_ != State::kIdle) {
      asio::post(self->strand_, [h = std::move(h)] { h(Error{"QMP: AsyncConnect called twice"}); });
      return;
    }
    self->state_ = State::kConnecting;
    self->socket_path_ = std::move(path);
    self->connect_timeout_ = timeout;
    self->connect_handler_ = std::move(h);
    self->connect_deadline_.expires_after(timeout);
    self->connect_deadline_.async_wait([self](const boost::system::error_code& ec) {
      if (ec || (self->state_ != State::kConnecting && self->state_ != State::kNegotiating)) return;
      const bool got_socket = self->state_ == State::kNegotiating;
      std::string why =
          got_socket && self->greeting_.is_null()
              ? " (connected but no greeting: QEMU 7.2 serves one QMP client at a time; is "
                "another client holding the socket?)"
              : "";
      self->Shutdown(Error{"QMP " + self->socket_path_ + ": not ready within " +
                           std::to_string(self->connect_timeout_.count()) + " ms" + why},
                     /*notify=*/false);
    });
    self->TryConnect();
  });
}

void QmpClient::TryConnect() {
  socket_ = asio::local::stream_protocol::socket(strand_);
  socket_.async_connect(
      asio::local::stream_protocol::endpoint(socket_path_),
      [self = shared_from_this()](const boost::system::error_code& ec) {
        if (self->state_ != State::kConnecting) return;
        if (ec) {
          // QEMU creates and listens on the socket early in
          // startup; until then retry, bounded by the deadline.
          self->retry_timer_.expires_after(kConnectRetry);
          self->retry_timer_.async_wait([self](const boost::system::error_code& tec) {
            if (!tec && self->state_ == State::kConnecting) self->TryConnect();
          });
          return;
        }
        // Who listens: the kernel's word for QEMU's pid, where a pid a
        // client gave could name any process.
        struct ucred cred {};
        socklen_t len = sizeof cred;
        if (::getsockopt(self->socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) ==
                0 &&
            cred.pid > 0) {
          self->peer_pid_.store(cred.pid);
        }
        self->state_ = State::kNegotiating;
        self->StartRead();
      });
}

void QmpClient::StartRead() {
  socket_.async_read_some(asio::buffer(read_buffer_), [self = shared_from_this()](
                                                          const boost::system::error_code& ec,
                                                          size_t n) {
    if (self->state_ == State::kClosed) return;
    if (ec) {
      std::string why = ec == asio::error::eof ? "closed by QEMU (process exited?)" : ec.message();
      Status tail = self->framer_.Finish();
      if (!tail.ok()) why += "; " + tail.error().message;
      self->Shutdown(Error{"QMP " + self->socket_path_ + ": connection " + why}, /*notify=*/true);
      return;
    }
    Status fed = self->framer_.Feed(std::string_view(self->read_buffer_.data(), n));
    nlohmann::json message;
    while (self->state_ != State::kClosed && self->framer_.Pop(&message)) {
      self->HandleMessage(std::move(message));
    }
    if (self->state_ == State::kClosed) return;
    if (!fed.ok()) {
      self->Shutdown(
          Error{"QMP " + self->socket_path_ + ": protocol error: " + fed.error().message},
          /*notify=*/true);
      return;
    }
    self->StartRead();
  });
}

void QmpClient::HandleMessage(nlohmann::json message) {
  if (auto it = message.find("QMP"); it != message.end()) {
    if (state_ != State::kNegotiating || !greeting_.is_null()) return;  // Only one greeting counts.
    greeting_ = it->is_object() ? *it : nlohmann::json::object();
    Send("qmp_capabilities", nlohmann::json::object(), connect_timeout_,
         [self = shared_from_this()](Result<nlohmann::json> reply) {
           if (self->state_ != State::kNegotiating) return;
           if (!reply.ok()) {
             self->Shutdown(Error{"QMP " + self->socket_path_ +
                                  ": qmp_capabilities failed: " + reply.error().message},
                            /*notify=*/false);
             return;
           }
           self->state_ = State::kReady;
           self->FinishConnect({});
         });
    return;
  }
  if (auto it = message.find("event"); it != message.end()) {
    if (!it->is_string()) return;
    QmpEvent event;
    event.name = it->get<std::string>();
    event.received = Clock::now();
    if (auto d = message.find("data"); d != message.end()) event.data = *d;
    if (event.data.is_null()) event.data = nlohmann::json::object();
    if (auto ts = message.find("timestamp"); ts != message.end() && ts->is_object()) {
      event.qemu_seconds = ts->value("seconds", int64_t{0});
      event.qemu_microseconds = ts->value("microseconds", int64_t{0});
    }
    if (event_handler_) event_handler_(event);
    return;
  }
  auto id_it = message.find("id");
  if (id_it == message.end() || !id_it->is_number_unsigned()) return;  // Not one of ours.
  auto pending = pending_.find(id_it->get<uint64_t>());
  if (pending == pending_.end()) return;  // Late reply to a timed-out command.
  Pending p = std::move(pending->second);
  pending_.erase(pending);
  p.timer->cancel();
  if (auto ret = message.find("return"); ret != message.end()) {
    p.handler(*ret);
  } else if (auto err = message.find("error"); err != message.end() && err->is_object()) {
    p.handler(Error{"QMP command '" + p.command +
                    "' failed: " + err->value("class", std::string("?")) + ": " +
                    err->value("desc", std::string("?"))});
  } else {
    p.handler(Error{"QMP command '" + p.command + "': reply has neither return nor error"});
  }
}

void QmpClient::AsyncExecute(std::string command, nlohmann::json arguments,
                             std::chrono::milliseconds timeout, ReplyHandler handler) {
  asio::dispatch(strand_, [self = shared_from_this(), command = std::move(command),
                           args = std::move(arguments), timeout, h = std::move(handler)]() mutable {
    self->Send(std::move(command), std::move(args), timeout, std::move(h));
  });
}

void QmpClient::Send(std::string command, nlohmann::json arguments,
                     std::chrono::milliseconds timeout, ReplyHandler handler) {
  if (state_ == State::kClosed || state_ == State::kIdle || state_ == State::kConnecting) {
    const std::string why = state_ == State::kClosed ? "connection is closed" : "not connected";
    asio::post(strand_, [h = std::move(handler), why, command] {
      h(Error{"QMP command '" + command + "': " + why});
    });
    return;
  }
  const uint64_t id = next_id_++;
  nlohmann::json request = {{"execute", command}, {"id", id}};
  if (!arguments.is_null() && !(arguments.is_object() && arguments.empty()))
    request["arguments"] = arguments;
  Pending p{command, std::move(handler), std::make_unique<asio::steady_timer>(strand_)};
  p.timer->expires_after(timeout);
  p.timer->async_wait(
      [self = shared_from_this(), id, timeout](const boost::system::error_code& ec) {
        if (ec) return;
        auto it = self->pending_.find(id);
        if (it == self->pending_.end()) return;
        Pending expired = std::move(it->second);
        self->pending_.erase(it);
        expired.handler(Error{"QMP command '" + expired.command + "' (id " + std::to_string(id) +
                              ") got no reply within " + std::to_string(timeout.count()) + " ms"});
      });
  pending_.emplace(id, std::move(p));
  write_queue_.push_back(request.dump() + "\r\n");
  if (!writing_) WriteNext();
}

void QmpClient::WriteNext() {
  if (write_queue_.empty() || state_ == State::kClosed) {
    writing_ = false;
    return;
  }
  writing_ = true;
  asio::async_write(socket_, asio::buffer(write_queue_.front()),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      if (self->state_ == State::kClosed) return;
                      if (ec) {
                        self->Shutdown(
                            Error{"QMP " + self->socket_path_ + ": write failed: " + ec.message()},
                            /*notify=*/true);
                        return;
                      }
                      self->write_queue_.pop_front();
                      self->WriteNext();
                    });
}

void QmpClient::FinishConnect(Status status) {
  connect_deadline_.cancel();
  if (connect_handler_) {
    ConnectHandler h = std::move(connect_handler_);
    connect_handler_ = nullptr;
    h(std::move(status));
  }
}

void QmpClient::Shutdown(const Error& error, bool notify) {
  if (state_ == State::kClosed) return;
  const bool was_connecting = state_ == State::kConnecting || state_ == State::kNegotiating;
  state_ = State::kClosed;
  boost::system::error_code ignored;
  socket_.close(ignored);
  retry_timer_.cancel();
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [id, p] : pending) {
    p.timer->cancel();
    p.handler(
        Error{"QMP command '" + p.command + "' (id " + std::to_string(id) + "): " + error.message});
  }
  write_queue_.clear();
  if (was_connecting) {
    FinishConnect(error);
  } else if (notify && disconnect_handler_) {
    disconnect_handler_(error);
  }
}

void QmpClient::Close() {
  asio::dispatch(strand_, [self = shared_from_this()] {
    self->connect_deadline_.cancel();
    self->Shutdown(Error{"QMP " + self->socket_path_ + ": closed"}, /*notify=*/false);
  });
}

// QmpSyncClient ----------------------------------------------------------------

QmpSyncClient::QmpSyncClient() = default;

Result<std::unique_ptr<QmpSyncClient>> QmpSyncClient::Connect(const std::string& socket_path,
                                                              std::chrono::milliseconds timeout,
                                                              size_t max_message_bytes) {
  std::unique_ptr<QmpSyncClient> c(new QmpSyncClient());
  c->client_ = QmpClient::Create(c->io_.get_executor(), max_message_bytes);
  QmpSyncClient* raw = c.get();
  c->client_->SetEventHandler([raw](const QmpEvent& e) { raw->OnEvent(e); });
  c->client_->SetDisconnectHandler([raw](const Error& e) { raw->OnDisconnect(e); });
  c->thread_ = std::thread([raw] {
    auto guard = asio::make_work_guard(raw->io_);
    raw->io_.run();
  });
  std::promise<Status> connected;
  auto future = connected.get_future();
  c->client_->AsyncConnect(socket_path, timeout,
                           [&connected](Status s) { connected.set_value(std::move(s)); });
  Status status = future.get();             // The client's own deadline bounds this.
  if (!status.ok()) return status.error();  // ~QmpSyncClient stops the thread.
  return c;
}

QmpSyncClient::~QmpSyncClient() {
  if (client_) client_->Close();
  // Let Close() run, then stop the loop; the work guard lives in the thread.
  asio::post(io_, [this] { io_.stop(); });
  if (thread_.joinable()) thread_.join();
}

void QmpSyncClient::OnEvent(const QmpEvent& event) {
  std::lock_guard lock(mutex_);
  events_.push_back(event);
  consumed_.push_back(false);
  changed_.notify_all();
}

void QmpSyncClient::OnDisconnect(const Error& error) {
  std::lock_guard lock(mutex_);
  disconnect_ = error;
  disconnected_at_ = Clock::now();
  changed_.notify_all();
}

Result<nlohmann::json> QmpSyncClient::Execute(const std::string& command, nlohmann::json arguments,
                                              std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<Result<nlohmann::json>>>();
  auto future = promise->get_future();
  client_->AsyncExecute(command, std::move(arguments), timeout,
                        [promise](Result<nlohmann::json> r) { promise->set_value(std::move(r)); });
  return future.get();  // The command timer bounds this.
}

Result<QmpEvent> QmpSyncClient::WaitForEvent(const std::string& name,
                                             std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lock(mutex_);
  size_t scanned = 0;
  while (true) {
    for (; scanned < events_.size(); ++scanned) {
      if (!consumed_[scanned] && events_[scanned].name == name) {
        consumed_[scanned] = true;
        return events_[scanned];
      }
    }
    if (disconnect_) {
      return Error{"QMP event " + name + " never came: " + disconnect_->message};
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
        scanned == events_.size() && !disconnect_) {
      std::string seen;
      for (const auto& e : events_) seen += (seen.empty() ? "" : ", ") + e.name;
      return Error{"QMP event " + name + " not received within " + std::to_string(timeout.count()) +
                   " ms (events so far: " + (seen.empty() ? "none" : seen) + ")"};
    }
  }
}

std::optional<Error> QmpSyncClient::WaitForDisconnect(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [this] { return disconnect_.has_value(); });
  return disconnect_;
}

std::vector<QmpEvent> QmpSyncClient::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

bool QmpSyncClient::connected() const {
  std::lock_guard lock(mutex_);
  return !disconnect_.has_value();
}

std::optional<Clock::time_point> QmpSyncClient::disconnected_at() const {
  std::lock_guard lock(mutex_);
  return disconnected_at_;
}

}  // namespace hvtrace::hostd
