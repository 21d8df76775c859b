//===- Args.cpp - option parsing of the pipec driver ----------------------===//
#include "Driver.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>

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
  llvm::raw_ostream &os = toStdout ? llvm::outs() : llvm::errs();
  os << "usage: pipec " << command << (posName.empty() ? "" : " " + posName)
     << " [options]\n";
  if (!posHelp.empty())
    os << "  " << posName << ": " << posHelp << "\n";
  os << "options:\n";
  for (auto &[name, spec] : specs) {
    std::string left = "  " + name + (spec.isFlag ? "" : " VALUE");
    os << left;
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
    llvm::StringRef a = raw[i];
    if (a == "-h" || a == "--help") {
      usage(true);
      helpShown = true;
      return false;
    }
    if (!a.starts_with("-") || a == "-") {
      pos.push_back(a.str());
      continue;
    }
    auto [name, inlineValue] = a.split('=');
    bool hasInline = a.contains('=');
    auto it = std::find_if(specs.begin(), specs.end(),
                           [&](auto &s) { return s.first == name; });
    if (it == specs.end()) {
      llvm::errs() << "pipec " << command << ": error: unknown option '"
                   << name << "'\n";
      usage(false);
      return false;
    }
    if (it->second.isFlag) {
      values[name.str()] = "1";
      continue;
    }
    if (hasInline) {
      values[name.str()] = inlineValue.str();
    } else if (i + 1 < raw.size()) {
      values[name.str()] = raw[++i];
    } else {
      llvm::errs() << "pipec " << command << ": error: option '" << name
                   << "' needs a value\n";
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
  llvm::StringRef text = llvm::StringRef(get(name)).trim();
  int64_t scale = 1;
  if (!text.empty()) {
    char unit = char(std::toupper(static_cast<unsigned char>(text.back())));
    if (unit == 'K' || unit == 'M' || unit == 'G') {
      scale = unit == 'K' ? 1LL << 10 : unit == 'M' ? 1LL << 20 : 1LL << 30;
      text = text.drop_back();
    }
  }
  uint64_t value = 0;
  if (text.getAsInteger(10, value) || value == 0 ||
      value > uint64_t(INT64_MAX / scale)) {
    llvm::errs() << "pipec " << command << ": error: " << name
                 << " takes bytes, optionally with K, M or G (KiB, MiB, "
                    "GiB), got '"
                 << get(name) << "'\n";
    return false;
  }
  out = int64_t(value) * scale;
  return true;
}

bool Args::getInt(const std::string &name, int64_t &out, int64_t min) const {
  std::string v = get(name);
  if (llvm::StringRef(v).getAsInteger(10, out) || out < min) {
    llvm::errs() << "pipec " << command << ": error: " << name
                 << " must be an integer >= " << min << ", got '" << v
                 << "'\n";
    return false;
  }
  return true;
}

bool Args::getDouble(const std::string &name, double &out) const {
  std::string v = get(name);
  if (llvm::StringRef(v).getAsDouble(out) || !std::isfinite(out)) {
    llvm::errs() << "pipec " << command << ": error: " << name
                 << " must be a number, got '" << v << "'\n";
    return false;
  }
  return true;
}

int pipec::driver::fail(const std::string &command, const std::string &message,
                        int rc) {
  llvm::errs() << "pipec " << command << ": error: " << message << "\n";
  return rc;
}
