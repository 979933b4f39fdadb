#include "s3_xml.h"

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <charconv>
#include <memory>

namespace hvtrace::hostd {
namespace {

struct DocFree {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

// No network, no entity expansion, no DTD loading: the body is the store's
// word, not ours.
Doc ParseXml(std::string_view body) {
  if (body.empty() || body.size() > kMaxXmlBody) return nullptr;
  return Doc(xmlReadMemory(body.data(), static_cast<int>(body.size()), "s3.xml", nullptr,
                           XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
}

bool IsElement(const xmlNode* node, const char* name) {
  return node->type == XML_ELEMENT_NODE &&
         xmlStrcmp(node->name, reinterpret_cast<const xmlChar*>(name)) == 0;
}

std::string Text(const xmlNode* node) {
  xmlChar* text = xmlNodeGetContent(node);
  if (text == nullptr) return {};
  std::string out(reinterpret_cast<const char*>(text));
  xmlFree(text);
  return out;
}

// The text of |parent|'s first child element |name|, or "".
std::string ChildText(const xmlNode* parent, const char* name) {
  for (const xmlNode* c = parent->children; c != nullptr; c = c->next) {
    if (IsElement(c, name)) return Text(c);
  }
  return {};
}

std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

Result<const xmlNode*> Root(const Doc& doc, const char* name, std::string_view what) {
  if (!doc) return Error{std::string(what) + ": not an XML document"};
  const xmlNode* root = xmlDocGetRootElement(doc.get());
  if (root == nullptr || !IsElement(root, name)) {
    return Error{std::string(what) + ": root element is not <" + name + ">"};
  }
  return root;
}

}  // namespace

S3ErrorBody ParseS3Error(std::string_view body) {
  Doc doc = ParseXml(body);
  auto root = Root(doc, "Error", "error body");
  if (!root.ok()) return {};
  S3ErrorBody out{ChildText(*root, "Code"), ChildText(*root, "Message")};
  // A message is for a log line, not a page of text.
  if (out.message.size() > 512) out.message.resize(512);
  if (out.code.size() > 128) out.code.resize(128);
  return out;
}

Result<S3ListPage> ParseListObjectsV2(std::string_view body) {
  Doc doc = ParseXml(body);
  auto root = Root(doc, "ListBucketResult", "ListObjectsV2 response");
  if (!root.ok()) return root.error();
  S3ListPage page;
  for (const xmlNode* c = (*root)->children; c != nullptr; c = c->next) {
    if (IsElement(c, "IsTruncated")) {
      page.truncated = Text(c) == "true";
    } else if (IsElement(c, "NextContinuationToken")) {
      page.next_token = Text(c);
    } else if (IsElement(c, "Contents")) {
      S3Object obj;
      obj.key = ChildText(c, "Key");
      obj.etag = Unquote(ChildText(c, "ETag"));
      std::string size = ChildText(c, "Size");
      auto [ptr, ec] = std::from_chars(size.data(), size.data() + size.size(), obj.size);
      if (obj.key.empty() || ec != std::errc() || ptr != size.data() + size.size()) {
        return Error{"ListObjectsV2 response: an entry without a key or size"};
      }
      page.objects.push_back(std::move(obj));
    }
  }
  if (page.truncated && page.next_token.empty()) {
    return Error{"ListObjectsV2 response: truncated without a continuation token"};
  }
  return page;
}

Result<std::vector<S3MultipartUpload>> ParseListMultipartUploads(std::string_view body) {
  Doc doc = ParseXml(body);
  auto root = Root(doc, "ListMultipartUploadsResult", "ListMultipartUploads response");
  if (!root.ok()) return root.error();
  std::vector<S3MultipartUpload> out;
  for (const xmlNode* c = (*root)->children; c != nullptr; c = c->next) {
    if (IsElement(c, "Upload")) out.push_back({ChildText(c, "Key"), ChildText(c, "UploadId")});
  }
  return out;
}

Result<std::string> ParseInitiateMultipart(std::string_view body) {
  Doc doc = ParseXml(body);
  auto root = Root(doc, "InitiateMultipartUploadResult", "InitiateMultipartUpload response");
  if (!root.ok()) return root.error();
  std::string id = ChildText(*root, "UploadId");
  if (id.empty()) return Error{"InitiateMultipartUpload response: no UploadId"};
  return id;
}

}  // namespace hvtrace::hostd
