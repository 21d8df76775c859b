//===- Args.cpp - option parsing of the pipec driver ----------------------===//
//
// Plain C++ (pipec-run links no LLVM): errors on stderr, usage on stdout
// for --help.
//
//===----------------------------------------------------------------------===//
#include "Driver.h"
#include "SysUtil.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>

namespace {

/// The whole of `text` as a base-10 integer (no sign for unsigned types,
/// no spaces, no '+').
template <typename T> bool parseInteger(const std::string &text, T &out) {
  const char *end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return !text.empty() && ec == std::errc() && ptr == end;
}

std::string trim(const std::string &text) {
  size_t a = 0, b = text.size();
  while (a < b && std::isspace(static_cast<unsigned char>(text[a])))
    ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(text[b - 1])))
    --b;
  return text.substr(a, b - a);
}

} // namespace

using namespace pipec::driver;

Args &Args::opt(const std::string &name, const std::string &help,
                const std::string &dflt) {
  specs.push_back({name, {help, dflt, false}});
  return *this;
}

Args &Args::flag(const std::string &name, const std::string &help) {
  specs.push_back({name, {help, "", true}});
  return *this;
}

Args &Args::positional(const std::string &name, const std::string &help) {
  posName = name;
  posHelp = help;
  return *this;
}

void Args::usage(bool toStdout) const {
  std::ostream &os = toStdout ? std::cout : std::cerr;
  os << "usage: " << who << (posName.empty() ? "" : " " + posName)
     << " [options]\n";
  if (!posHelp.empty())
    os << "  " << posName << ": " << posHelp << "\n";
  os << "options:\n";
  for (auto &[name, spec] : specs) {
    std::string left = "  " + name + (spec.isFlag ? "" : " VALUE");
    os << left;
    if (left.size() >= 30) // a long name: its help on the next line
      os << '\n' << std::string(30, ' ');
    for (size_t i = left.size(); i < 30; ++i)
      os << ' ';
    os << spec.help;
    if (!spec.dflt.empty())
      os << " (default " << spec.dflt << ")";
    os << "\n";
  }
}

bool Args::parse() {
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::string &a = raw[i];
    if (a == "-h" || a == "--help") {
      usage(true);
      helpShown = true;
      return false;
    }
    if (a.empty() || a[0] != '-' || a == "-") {
      pos.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    const bool hasInline = eq != std::string::npos;
    const std::string name = a.substr(0, eq);
    const std::string inlineValue = hasInline ? a.substr(eq + 1) : "";
    auto it = std::find_if(specs.begin(), specs.end(),
                           [&](auto &s) { return s.first == name; });
    if (it == specs.end()) {
      std::cerr << who << ": error: unknown option '" << name << "'\n";
      usage(false);
      return false;
    }
    if (it->second.isFlag) {
      values[name] = "1";
      continue;
    }
    if (hasInline) {
      values[name] = inlineValue;
    } else if (i + 1 < raw.size()) {
      values[name] = raw[++i];
    } else {
      std::cerr << who << ": error: option '" << name << "' needs a value\n";
      return false;
    }
  }
  return true;
}

std::string Args::get(const std::string &name) const {
  if (auto it = values.find(name); it != values.end())
    return it->second;
  for (auto &[n, spec] : specs)
    if (n == name)
      return spec.dflt;
  return "";
}

bool Args::has(const std::string &name) const { return values.count(name); }

bool Args::getBytes(const std::string &name, int64_t &out) const {
  std::string text = trim(get(name));
  int64_t scale = 1;
  if (!text.empty()) {
    char unit = char(std::toupper(static_cast<unsigned char>(text.back())));
    if (unit == 'K' || unit == 'M' || unit == 'G') {
      scale = unit == 'K' ? 1LL << 10 : unit == 'M' ? 1LL << 20 : 1LL << 30;
      text.pop_back();
    }
  }
  uint64_t value = 0;
  if (!parseInteger(text, value) || value == 0 ||
      value > uint64_t(INT64_MAX / scale)) {
    std::cerr << who << ": error: " << name
              << " takes bytes, optionally with K, M or G (KiB, MiB, "
                 "GiB), got '"
              << get(name) << "'\n";
    return false;
  }
  out = int64_t(value) * scale;
  return true;
}

bool Args::getInt(const std::string &name, int64_t &out, int64_t min,
                  int64_t max) const {
  std::string v = get(name);
  if (!parseInteger(v, out) || out < min || out > max) {
    std::cerr << who << ": error: " << name << " must be an integer ";
    if (max == std::numeric_limits<int64_t>::max())
      std::cerr << ">= " << min;
    else
      std::cerr << "from " << min << " to " << max;
    std::cerr << ", got '" << v << "'\n";
    return false;
  }
  return true;
}

bool Args::getDouble(const std::string &name, double &out) const {
  std::string v = get(name);
  char *end = nullptr;
  out = v.empty() ? 0 : std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(out)) {
    std::cerr << who << ": error: " << name << " must be a number, got '" << v
              << "'\n";
    return false;
  }
  return true;
}

int pipec::driver::fail(const std::string &command, const std::string &message,
                        int rc) {
  // "pipec-run" names a program of its own; the rest are pipec's commands.
  std::cerr << (command.rfind("pipec-", 0) == 0 ? "" : "pipec ") << command
            << ": error: " << message << "\n";
  return rc;
}

bool pipec::driver::parseInputShapes(
    const Args &a, std::map<std::string, std::vector<int64_t>> &out,
    const std::string &command) {
  // The option's text lives here while its pieces are read.
  const std::string spec = a.get("--input-shape");
  if (spec.empty())
    return true;
  for (const std::string &item : sys::split(spec, ',')) {
    const size_t eq = item.rfind('=');
    std::vector<int64_t> shape;
    bool ok = eq != std::string::npos && eq > 0;
    if (ok)
      for (const std::string &d : sys::split(item.substr(eq + 1), 'x')) {
        int64_t v = 0;
        if (!parseInteger(d, v) || v <= 0) {
          ok = false;
          break;
        }
        shape.push_back(v);
      }
    if (!ok) {
      fail(command, "bad --input-shape '" + item +
                        "' (expected NAME=D0xD1x..., several separated by "
                        "',')");
      return false;
    }
    out[item.substr(0, eq)] = shape;
  }
  return true;
}
