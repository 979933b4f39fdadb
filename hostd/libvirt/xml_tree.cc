#include "xml_tree.h"

#include <libxml/parser.h>
#include <libxml/xmlsave.h>

#include <cstring>

namespace hvtrace::hostd::xml {
namespace {

// libxml2 quotes attributes with '"'; libvirt with "'" outside <metadata>.
// Converted back so a diff shows only what changed. Inside a tag a raw '"'
// only delimits values (libxml2 writes one inside a value as &quot;).
std::string LibvirtQuotes(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  bool in_tag = false, in_value = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (!in_tag) {
      // Comments as they are; <metadata> too: libvirt writes the elements
      // of other applications (and hvtrace's record) with '"' itself.
      const bool comment = in.compare(i, 4, "<!--") == 0;
      if (comment || in.compare(i, 10, "<metadata>") == 0) {
        const char* close = comment ? "-->" : "</metadata>";
        const size_t end = in.find(close, i);
        const size_t stop = end == std::string::npos ? in.size() : end + std::strlen(close);
        out.append(in, i, stop - i);
        i = stop - 1;
        continue;
      }
      in_tag = c == '<';
      out += c;
    } else if (c == '"') {
      in_value = !in_value;
      out += '\'';
    } else if (in_value && c == '\'') {
      out += "&apos;";
    } else {
      if (!in_value && c == '>') in_tag = false;
      out += c;
    }
  }
  return out;
}

std::string Take(xmlBuffer* buf) {
  std::string out(reinterpret_cast<const char*>(xmlBufferContent(buf)),
                  static_cast<size_t>(xmlBufferLength(buf)));
  xmlBufferFree(buf);
  return LibvirtQuotes(out);
}

}  // namespace

Result<DocPtr> Parse(std::string_view text, const char* root) {
  if (text.size() > kMaxDomainXmlBytes) {
    return Error{"domain XML of " + std::to_string(text.size()) + " bytes is larger than the " +
                 std::to_string(kMaxDomainXmlBytes) + "-byte limit"};
  }
  // No XML_PARSE_NOENT: entities stay references, never expanded.
  DocPtr doc(xmlReadMemory(text.data(), static_cast<int>(text.size()), "domain.xml", nullptr,
                           XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
  if (!doc) {
    const xmlError* e = xmlGetLastError();
    std::string why = e != nullptr && e->message != nullptr ? e->message : "malformed";
    while (!why.empty() && why.back() == '\n') why.pop_back();
    return Error{"domain XML does not parse: " + why};
  }
  if (!Named(xmlDocGetRootElement(doc.get()), root)) {
    return Error{std::string("domain XML has no <") + root + "> root element"};
  }
  return doc;
}

bool Named(const xmlNode* node, const char* name) {
  return node != nullptr && node->type == XML_ELEMENT_NODE && node->ns == nullptr &&
         xmlStrEqual(node->name, X(name));
}

xmlNode* Child(xmlNode* parent, const char* name) {
  if (parent == nullptr) return nullptr;
  for (xmlNode* c = parent->children; c != nullptr; c = c->next) {
    if (Named(c, name)) return c;
  }
  return nullptr;
}

std::vector<xmlNode*> Children(xmlNode* parent, const char* name) {
  std::vector<xmlNode*> out;
  if (parent == nullptr) return out;
  for (xmlNode* c = parent->children; c != nullptr; c = c->next) {
    if (Named(c, name)) out.push_back(c);
  }
  return out;
}

std::string Prop(const xmlNode* node, const char* name) {
  if (node == nullptr) return {};
  xmlChar* v = xmlGetNoNsProp(node, X(name));
  if (v == nullptr) return {};
  std::string out(reinterpret_cast<const char*>(v));
  xmlFree(v);
  return out;
}

std::string Text(const xmlNode* node) {
  if (node == nullptr) return {};
  xmlChar* v = xmlNodeGetContent(node);
  if (v == nullptr) return {};
  std::string out(reinterpret_cast<const char*>(v));
  xmlFree(v);
  size_t b = out.find_first_not_of(" \t\r\n"), e = out.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : out.substr(b, e - b + 1);
}

void SetProp(xmlNode* node, const char* name, const std::string& value) {
  xmlSetProp(node, X(name), X(value.c_str()));
}

xmlNode* NewElement(xmlDoc* doc, const char* name,
                    std::initializer_list<std::pair<const char*, std::string>> props,
                    const std::string& text) {
  xmlNode* node = xmlNewDocNode(doc, nullptr, X(name), nullptr);
  for (const auto& [k, v] : props) SetProp(node, k, v);
  // xmlNodeAddContent escapes: the text is data, never markup.
  if (!text.empty()) xmlNodeAddContent(node, X(text.c_str()));
  return node;
}

xmlNode* AddChild(xmlNode* parent, const char* name,
                  std::initializer_list<std::pair<const char*, std::string>> props,
                  const std::string& text) {
  return xmlAddChild(parent, NewElement(parent->doc, name, props, text));
}

std::string Dump(xmlDoc* doc) {
  xmlBuffer* buf = xmlBufferCreate();
  xmlSaveCtxt* save = xmlSaveToBuffer(buf, "UTF-8", XML_SAVE_FORMAT | XML_SAVE_NO_DECL);
  xmlSaveDoc(save, doc);
  xmlSaveClose(save);
  return Take(buf);
}

std::string DumpElement(xmlDoc* doc, xmlNode* node, bool indent) {
  xmlBuffer* buf = xmlBufferCreate();
  xmlNodeDump(buf, doc, node, 0, indent ? 1 : 0);
  return Take(buf);
}

}  // namespace hvtrace::hostd::xml
