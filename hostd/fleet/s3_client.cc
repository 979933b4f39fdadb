#include "s3_client.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <nettle/base64.h>
#include <nettle/md5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "sha256.h"
#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

// AWS's query encoding: unreserved characters stay, everything else %XX
// (upper case), so the URL we send is already the canonical query string.
std::string UriEncode(std::string_view s) {
  static const char* kDigits = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 15];
    }
  }
  return out;
}

}  // namespace

std::string Md5Hex(std::span<const std::byte> data) {
  md5_ctx ctx;
  md5_init(&ctx);
  if (!data.empty()) md5_update(&ctx, data.size(), reinterpret_cast<const uint8_t*>(data.data()));
  uint8_t digest[MD5_DIGEST_SIZE];
  md5_digest(&ctx, sizeof digest, digest);
  return Hex(digest, sizeof digest);
}

std::string Md5Base64(std::span<const std::byte> data) {
  md5_ctx ctx;
  md5_init(&ctx);
  if (!data.empty()) md5_update(&ctx, data.size(), reinterpret_cast<const uint8_t*>(data.data()));
  uint8_t digest[MD5_DIGEST_SIZE];
  md5_digest(&ctx, sizeof digest, digest);
  char out[BASE64_ENCODE_RAW_LENGTH(MD5_DIGEST_SIZE) + 1];
  base64_encode_raw(out, sizeof digest, digest);
  out[sizeof out - 1] = '\0';
  return out;
}

Status ValidateObjectKey(std::string_view key) {
  auto bad = [&](const std::string& why) {
    return Error{"object key '" + std::string(key.substr(0, 200)) + "': " + why};
  };
  if (key.empty() || key.size() > 1024) return bad("must be 1..1024 bytes");
  if (key.front() == '/') return bad("starts with '/'");
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' &&
        c != '/') {
      return bad("holds a character other than [A-Za-z0-9._/-]");
    }
  }
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view part = key.substr(start, end - start);
    if (part.empty() && end != key.size()) return bad("has an empty component");
    if (part == "." || part == "..") return bad("has a '.' or '..' component");
    start = end + 1;
  }
  return {};
}

Status ValidateS3Config(const S3Config& c) {
  if (c.endpoint.rfind("http://", 0) != 0 && c.endpoint.rfind("https://", 0) != 0) {
    return Error{"endpoint '" + c.endpoint + "' must start with http:// or https://"};
  }
  if (c.endpoint.back() == '/') return Error{"endpoint '" + c.endpoint + "' ends with '/'"};
  if (c.bucket.size() < 3 || c.bucket.size() > 63) {
    return Error{"bucket '" + c.bucket + "' must be 3..63 characters"};
  }
  for (char ch : c.bucket) {
    if (!std::islower(static_cast<unsigned char>(ch)) &&
        !std::isdigit(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') {
      return Error{"bucket '" + c.bucket + "' may hold only [a-z0-9.-]"};
    }
  }
  if (c.region.empty() || c.region.find_first_of(":/ ") != std::string::npos) {
    return Error{"region '" + c.region + "' is not a region name"};
  }
  if (c.access_key.empty() || c.secret_key.empty()) return Error{"no access key or secret key"};
  if (c.access_key.find(':') != std::string::npos) return Error{"access key holds ':'"};
  return {};
}

struct S3Client::Request {
  std::string method = "GET";
  std::string key;    // "" for the bucket itself.
  std::string query;  // Canonical (sorted, encoded), without '?'.
  std::span<const std::byte> body;
  std::string content_md5;          // Base64, or "".
  std::string content_type;         // Or "".
  int out_fd = -1;                  // GET into this file instead of memory …
  uint64_t max_body = kMaxXmlBody;  // … at most this many bytes.
};

struct S3Client::Response {
  long status = 0;
  std::string body;
  std::string etag;  // Without quotes.
  uint64_t content_length = 0;
  uint64_t written = 0;  // To out_fd.
};

S3Client::S3Client(S3Config config) : config_(std::move(config)) {
  GlobalInit();
  curl_ = curl_easy_init();
}

S3Client::~S3Client() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

Error S3Client::Fail(const Request& r, long status, std::string_view body, std::string detail) {
  S3ErrorBody parsed = status >= 300 ? ParseS3Error(body) : S3ErrorBody{};
  std::string msg = "S3 " + r.method + " " + config_.endpoint + "/" + config_.bucket;
  if (!r.key.empty()) msg += "/" + r.key;
  msg += ": ";
  if (status != 0) msg += "HTTP " + std::to_string(status);
  if (!parsed.code.empty()) msg += " " + parsed.code;
  if (!parsed.message.empty()) msg += " (" + parsed.message + ")";
  if (!detail.empty()) msg += (status != 0 ? ": " : "") + detail;
  last_failure_ = {status, parsed.code, msg};
  return Error{msg};
}

namespace {

struct Transfer {
  std::span<const std::byte> upload;
  size_t sent = 0;
  std::string* body = nullptr;
  int out_fd = -1;
  uint64_t max_body = 0;
  uint64_t received = 0;
  bool too_big = false;
  int write_errno = 0;
  std::string* etag = nullptr;
};

size_t ReadBody(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t want = std::min(size * n, t->upload.size() - t->sent);
  if (want > 0) std::memcpy(buf, t->upload.data() + t->sent, want);
  t->sent += want;
  return want;
}

size_t WriteBody(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t len = size * n;
  if (t->received + len > t->max_body) {
    t->too_big = true;
    return 0;  // Ends the transfer (CURLE_WRITE_ERROR).
  }
  t->received += len;
  if (t->out_fd >= 0) {
    size_t done = 0;
    while (done < len) {
      ssize_t w = ::write(t->out_fd, buf + done, len - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        t->write_errno = errno;
        return 0;
      }
      done += static_cast<size_t>(w);
    }
  } else {
    t->body->append(buf, len);
  }
  return len;
}

int Progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancelled = static_cast<const std::function<bool()>*>(user);
  return (*cancelled && (*cancelled)()) ? 1 : 0;
}

size_t ReadHeader(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(buf, size * n);
  constexpr std::string_view kEtag = "etag:";
  if (line.size() > kEtag.size() && line.size() < 512 &&
      strncasecmp(line.data(), kEtag.data(), kEtag.size()) == 0) {
    std::string v(line.substr(kEtag.size()));
    while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.pop_back();
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
    *t->etag = v;
  }
  return size * n;
}

}  // namespace

Result<S3Client::Response> S3Client::PerformOnce(Request& r) {
  CURL* curl = static_cast<CURL*>(curl_);
  if (curl == nullptr) return Fail(r, 0, {}, "curl_easy_init failed");
  curl_easy_reset(curl);
  std::string url = config_.endpoint + "/" + config_.bucket + (r.key.empty() ? "" : "/" + r.key);
  if (!r.query.empty()) url += "?" + r.query;
  Response resp;
  Transfer t;
  t.upload = r.body;
  t.body = &resp.body;
  t.out_fd = r.out_fd;
  t.max_body = r.max_body;
  t.etag = &resp.etag;
  if (r.out_fd >= 0) {
    // A retry starts the file again.
    if (::ftruncate(r.out_fd, 0) != 0 || ::lseek(r.out_fd, 0, SEEK_SET) != 0) {
      return Fail(r, 0, {}, std::string("cannot rewind the output file: ") + std::strerror(errno));
    }
  }
  std::string sigv4 = "aws:amz:" + config_.region + ":s3";
  std::string sha = r.body.empty() ? std::string(kEmptySha256) : Sha256Hex(r.body);
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, ("x-amz-content-sha256: " + sha).c_str());
  if (!r.content_md5.empty()) {
    headers = curl_slist_append(headers, ("Content-MD5: " + r.content_md5).c_str());
  }
  if (!r.content_type.empty()) {
    headers = curl_slist_append(headers, ("Content-Type: " + r.content_type).c_str());
  }
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(curl, CURLOPT_USERNAME, config_.access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, config_.secret_key.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT,
                   static_cast<long>(config_.connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(config_.stall_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, ReadHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, Progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &config_.cancelled);
  if (r.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
  } else if (r.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, reinterpret_cast<const char*>(r.body.data()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
  } else if (r.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (r.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);
  curl_off_t length = -1;
  curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
  resp.content_length = length > 0 ? static_cast<uint64_t>(length) : 0;
  resp.written = t.received;
  if (t.too_big) {
    return Fail(r, resp.status, {},
                "the answer is larger than " + std::to_string(r.max_body) + " bytes");
  }
  if (t.write_errno != 0) {
    return Fail(r, resp.status, {},
                std::string("writing the download: ") + std::strerror(t.write_errno));
  }
  if (rc != CURLE_OK) return Fail(r, 0, {}, curl_easy_strerror(rc));
  if (resp.status < 200 || resp.status >= 300) {
    return Fail(r, resp.status, resp.body,
                resp.status >= 300 && resp.status < 400 ? "redirects are not followed" : "");
  }
  return resp;
}

Result<S3Client::Response> S3Client::Perform(Request& r) {
  std::chrono::milliseconds backoff = config_.first_backoff;
  for (int attempt = 1;; ++attempt) {
    Result<Response> resp = PerformOnce(r);
    if (resp.ok()) return resp;
    const long status = last_failure_.http_status;
    const bool retryable = status == 0 || status >= 500;
    if (!retryable || attempt >= config_.attempts) return resp;
    if (config_.cancelled && config_.cancelled()) return resp;
    std::this_thread::sleep_for(backoff);
    backoff *= 2;
  }
}

Result<std::string> S3Client::PutBytes(std::string_view key, std::span<const std::byte> data) {
  if (Status ok = ValidateObjectKey(key); !ok.ok()) return ok.error();
  Request r;
  r.method = "PUT";
  r.key = std::string(key);
  r.body = data;
  r.content_md5 = Md5Base64(data);
  auto resp = Perform(r);
  if (!resp.ok()) return resp.error();
  const std::string md5 = Md5Hex(data);
  if (resp->etag != md5) {
    return Fail(r, resp->status, {}, "ETag '" + resp->etag + "' is not the MD5 " + md5);
  }
  return resp->etag;
}

namespace {

Result<std::vector<std::byte>> ReadRange(int fd, const std::filesystem::path& path, uint64_t offset,
                                         uint64_t size) {
  std::vector<std::byte> buf(size);
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, buf.data() + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Error{"reading " + path.string() + " at " + std::to_string(offset + done) + ": " +
                   (n == 0 ? "file shrank" : std::strerror(errno))};
    }
    done += static_cast<uint64_t>(n);
  }
  return buf;
}

}  // namespace

Result<std::string> S3Client::PutFile(std::string_view key, const std::filesystem::path& path,
                                      const std::function<void(const std::string&)>& on_upload_id) {
  if (Status ok = ValidateObjectKey(key); !ok.ok()) return ok.error();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) return Error{"cannot open " + path.string() + ": " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Error{path.string() + " is not a regular file"};
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > config_.multipart_threshold) return PutMultipart(key, path, size, on_upload_id);
  auto data = ReadRange(fd.get(), path, 0, size);
  if (!data.ok()) return data.error();
  return PutBytes(key, *data);
}

Result<std::string> S3Client::PutMultipart(
    std::string_view key, const std::filesystem::path& path, uint64_t size,
    const std::function<void(const std::string&)>& on_upload_id) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) return Error{"cannot open " + path.string() + ": " + std::strerror(errno)};
  Request init;
  init.method = "POST";
  init.key = std::string(key);
  init.query = "uploads=";
  auto started = Perform(init);
  if (!started.ok()) return started.error();
  auto upload_id = ParseInitiateMultipart(started->body);
  if (!upload_id.ok()) return Fail(init, started->status, {}, upload_id.error().message);
  if (on_upload_id) on_upload_id(*upload_id);

  // From here every failure aborts the upload, so the store keeps no parts.
  auto abort_with = [&](Error e) -> Error {
    S3Failure failure = last_failure_;
    (void)AbortMultipart(key, *upload_id);
    last_failure_ = failure;
    return e;
  };
  std::string complete = "<CompleteMultipartUpload>";
  std::string md5s;  // The parts' binary MD5s, for the final ETag.
  int part = 0;
  for (uint64_t offset = 0; offset < size; offset += config_.part_size) {
    ++part;
    const uint64_t len = std::min(config_.part_size, size - offset);
    auto data = ReadRange(fd.get(), path, offset, len);
    if (!data.ok()) return abort_with(data.error());
    Request put;
    put.method = "PUT";
    put.key = std::string(key);
    put.query = "partNumber=" + std::to_string(part) + "&uploadId=" + UriEncode(*upload_id);
    put.body = *data;
    put.content_md5 = Md5Base64(*data);
    auto resp = Perform(put);
    if (!resp.ok()) return abort_with(resp.error());
    const std::string md5 = Md5Hex(*data);
    if (resp->etag != md5) {
      return abort_with(Fail(
          put, resp->status, {},
          "part " + std::to_string(part) + " ETag '" + resp->etag + "' is not its MD5 " + md5));
    }
    for (size_t i = 0; i + 1 < md5.size(); i += 2) {
      md5s += static_cast<char>(std::stoi(md5.substr(i, 2), nullptr, 16));
    }
    complete += "<Part><PartNumber>" + std::to_string(part) + "</PartNumber><ETag>\"" + md5 +
                "\"</ETag></Part>";
  }
  complete += "</CompleteMultipartUpload>";
  Request done;
  done.method = "POST";
  done.key = std::string(key);
  done.query = "uploadId=" + UriEncode(*upload_id);
  done.body = std::as_bytes(std::span(complete));
  done.content_type = "application/xml";
  auto resp = Perform(done);
  if (!resp.ok()) return abort_with(resp.error());
  // A 200 may still carry an <Error> (S3 sends it after a keep-alive).
  S3ErrorBody late = ParseS3Error(resp->body);
  if (!late.code.empty()) return abort_with(Fail(done, 500, resp->body, "completion failed"));
  const std::string expect = Md5Hex(std::as_bytes(std::span(md5s))) + "-" + std::to_string(part);
  auto head = Head(key);
  if (!head.ok()) return head.error();
  if (head->etag != expect || head->size != size) {
    return Fail(done, 0, {},
                "the stored object has ETag '" + head->etag + "', " + std::to_string(head->size) +
                    " bytes; expected '" + expect + "', " + std::to_string(size) + " bytes");
  }
  return head->etag;
}

Status S3Client::GetToFile(std::string_view key, const std::filesystem::path& path,
                           uint64_t max_bytes) {
  if (Status ok = ValidateObjectKey(key); !ok.ok()) return ok.error();
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (fd.get() < 0) return Error{"cannot create " + path.string() + ": " + std::strerror(errno)};
  Request r;
  r.key = std::string(key);
  r.out_fd = fd.get();
  r.max_body = max_bytes;
  auto resp = Perform(r);
  if (!resp.ok()) {
    ::unlink(path.c_str());
    return resp.error();
  }
  if (resp->etag.find('-') == std::string::npos && !resp->etag.empty()) {
    // A plain ETag is the MD5 of the bytes: check what landed on disk.
    auto data = ReadRange(fd.get(), path, 0, resp->written);
    if (!data.ok()) return data.error();
    if (Md5Hex(*data) != resp->etag) {
      ::unlink(path.c_str());
      return Fail(r, resp->status, {}, "the download's MD5 is not its ETag " + resp->etag);
    }
  }
  if (::fsync(fd.get()) != 0) return Error{"fsync " + path.string() + ": " + std::strerror(errno)};
  return {};
}

Result<std::string> S3Client::GetBytes(std::string_view key, uint64_t max_bytes) {
  if (Status ok = ValidateObjectKey(key); !ok.ok()) return ok.error();
  Request r;
  r.key = std::string(key);
  r.max_body = max_bytes;
  auto resp = Perform(r);
  if (!resp.ok()) return resp.error();
  if (!resp->etag.empty() && resp->etag.find('-') == std::string::npos &&
      Md5Hex(std::as_bytes(std::span(resp->body))) != resp->etag) {
    return Fail(r, resp->status, {}, "the body's MD5 is not its ETag " + resp->etag);
  }
  return std::move(resp->body);
}

Result<S3Object> S3Client::Head(std::string_view key) {
  if (Status ok = ValidateObjectKey(key); !ok.ok()) return ok.error();
  Request r;
  r.method = "HEAD";
  r.key = std::string(key);
  auto resp = Perform(r);
  if (!resp.ok()) return resp.error();
  return S3Object{std::string(key), resp->content_length, resp->etag};
}

Result<std::vector<S3Object>> S3Client::List(std::string_view prefix, size_t max_objects) {
  std::vector<S3Object> out;
  std::string token;
  for (;;) {
    Request r;
    // Sorted by name: the URL is the canonical query SigV4 signs.
    r.query = (token.empty() ? "" : "continuation-token=" + UriEncode(token) + "&") +
              "list-type=2&max-keys=1000&prefix=" + UriEncode(prefix);
    auto resp = Perform(r);
    if (!resp.ok()) return resp.error();
    auto page = ParseListObjectsV2(resp->body);
    if (!page.ok()) return Fail(r, resp->status, {}, page.error().message);
    for (S3Object& o : page->objects) out.push_back(std::move(o));
    if (out.size() > max_objects) {
      return Fail(r, resp->status, {}, "more than " + std::to_string(max_objects) + " objects");
    }
    if (!page->truncated) return out;
    token = page->next_token;
  }
}

Result<std::vector<S3MultipartUpload>> S3Client::ListMultipartUploads(std::string_view prefix) {
  Request r;
  r.query = "prefix=" + UriEncode(prefix) + "&uploads=";
  auto resp = Perform(r);
  if (!resp.ok()) return resp.error();
  auto uploads = ParseListMultipartUploads(resp->body);
  if (!uploads.ok()) return Fail(r, resp->status, {}, uploads.error().message);
  return uploads;
}

Status S3Client::AbortMultipart(std::string_view key, std::string_view upload_id) {
  Request r;
  r.method = "DELETE";
  r.key = std::string(key);
  r.query = "uploadId=" + UriEncode(upload_id);
  auto resp = Perform(r);
  if (!resp.ok()) {
    // Already gone (completed or aborted before): nothing is left either way.
    if (last_failure_.http_status == 404) return {};
    return resp.error();
  }
  return {};
}

Status S3Client::CheckBucket() {
  // A GET of one key, not a HEAD: a HEAD's error has no body to name it.
  Request r;
  r.query = "list-type=2&max-keys=1";
  auto resp = Perform(r);
  if (!resp.ok()) return resp.error();
  return {};
}

}  // namespace hvtrace::hostd
