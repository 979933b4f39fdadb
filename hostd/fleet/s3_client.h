// A small S3 client over libcurl for the operations hvtrace's fleet upload
// and `hvtrace fleet` need: PUT (single or multipart), GET to a file, HEAD,
// ListObjectsV2 and ListMultipartUploads. Requests are path-style
// (<endpoint>/<bucket>/<key>) and signed by libcurl's CURLOPT_AWS_SIGV4; the
// payload's SHA-256 goes in x-amz-content-sha256 (Ceph RGW refuses a
// signature without it) and its MD5 in Content-MD5, and every ETag that is a
// plain MD5 is compared with ours.
//
// The store is untrusted: bodies read into memory are capped (kMaxXmlBody),
// downloads are capped by the caller, redirects are never followed, and only
// http/https are spoken. Connection errors and 5xx answers are retried with
// exponential backoff; 4xx answers are not (they do not get better).
// Errors name the endpoint, bucket, key, HTTP status and the store's
// Code/Message ("NoSuchBucket", "InvalidAccessKeyId", …).
//
// Not thread-safe: one client per thread.
#ifndef HVTRACE_HOSTD_FLEET_S3_CLIENT_H_
#define HVTRACE_HOSTD_FLEET_S3_CLIENT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"
#include "s3_xml.h"

namespace hvtrace::hostd {

struct S3Config {
  std::string endpoint;  // http(s)://host[:port], no trailing slash.
  std::string bucket;
  std::string region = "us-east-1";
  std::string access_key;
  std::string secret_key;
  int attempts = 4;                              // Per request, for 5xx/connection errors.
  std::chrono::milliseconds first_backoff{200};  // Doubled per retry.
  std::chrono::seconds connect_timeout{10};
  std::chrono::seconds stall_timeout{30};     // No progress for this long: error.
  uint64_t multipart_threshold = 8ull << 20;  // Objects above it go in parts …
  uint64_t part_size = 8ull << 20;            // … of this size.
  // Polled during transfers and between retries: true ends the request (a
  // daemon shutting down). May be empty.
  std::function<bool()> cancelled;
};

// Checks the fields a client needs (endpoint scheme, bucket name, keys).
Status ValidateS3Config(const S3Config& config);

// What a failed request said, for callers that act on it (the uploader keeps
// the last one; tests check the code).
struct S3Failure {
  long http_status = 0;  // 0: no answer (connection error).
  std::string code;      // The store's error Code, or "".
  std::string message;   // The whole error, with its context.
};

class S3Client {
 public:
  explicit S3Client(S3Config config);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Config& config() const { return config_; }
  // The last failure of any call (empty message: none yet).
  const S3Failure& last_failure() const { return last_failure_; }

  // Stores |data| under |key| in one PUT; returns the ETag (checked: the MD5).
  Result<std::string> PutBytes(std::string_view key, std::span<const std::byte> data);

  // Stores the file |path| under |key|: one PUT up to multipart_threshold,
  // else a multipart upload whose parts are each checked and which is
  // aborted when anything fails. |on_upload_id| is called with the upload
  // id before the first part (the caller records it to abort it after a
  // crash). Returns the ETag.
  Result<std::string> PutFile(std::string_view key, const std::filesystem::path& path,
                              const std::function<void(const std::string&)>& on_upload_id = {});

  // Downloads |key| into a new file |path| (mode 0644 under the umask),
  // refusing objects above |max_bytes|; a plain-MD5 ETag is checked.
  Status GetToFile(std::string_view key, const std::filesystem::path& path, uint64_t max_bytes);
  // Downloads |key| into memory, at most |max_bytes|.
  Result<std::string> GetBytes(std::string_view key, uint64_t max_bytes);

  // The object's size and ETag; an error (http_status 404) when absent.
  Result<S3Object> Head(std::string_view key);

  // Every object under |prefix|, following continuation tokens, at most
  // |max_objects| (an error past it).
  Result<std::vector<S3Object>> List(std::string_view prefix, size_t max_objects = 1000000);

  // The multipart uploads in progress under |prefix|.
  Result<std::vector<S3MultipartUpload>> ListMultipartUploads(std::string_view prefix);
  Status AbortMultipart(std::string_view key, std::string_view upload_id);

  // HEAD on the bucket: reachable, credentials good, bucket there.
  Status CheckBucket();

 private:
  struct Request;
  struct Response;
  // One request with retries; a non-2xx answer becomes an error.
  Result<Response> Perform(Request& request);
  Result<Response> PerformOnce(Request& request);
  Error Fail(const Request& request, long status, std::string_view body, std::string detail);
  Result<std::string> PutMultipart(std::string_view key, const std::filesystem::path& path,
                                   uint64_t size,
                                   const std::function<void(const std::string&)>& on_upload_id);

  S3Config config_;
  void* curl_ = nullptr;  // CURL*, reused for keep-alive.
  S3Failure last_failure_;
};

// Base64 of the MD5 of |data| (Content-MD5) and its lowercase hex (ETag).
std::string Md5Base64(std::span<const std::byte> data);
std::string Md5Hex(std::span<const std::byte> data);

// A key we write or read: 1..1024 bytes of [A-Za-z0-9._/-], no "//", no
// leading '/', no "." or ".." component (keys become local paths in fetch).
Status ValidateObjectKey(std::string_view key);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_S3_CLIENT_H_
