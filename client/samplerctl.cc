// samplerctl: the samplerd command-line tool.
//
//   samplerctl run-local FILE [--threads=N]       FILE's steps through the CPU backend in-process
//   samplerctl sample --target=ADDR FILE [--stream]  FILE's steps through a running samplerd
//   samplerctl info --target=ADDR                  GetServerInfo, as JSON
//   samplerctl health --target=ADDR [--service=S] [--live]
//                                                  grpc.health.v1 Check: prints SERVING or
//                                                  NOT_SERVING, exits 0 only when SERVING
//                                                  (--live: whenever the server answers, for
//                                                  liveness probes that must pass while it
//                                                  drains)
//   samplerctl bench --target=ADDR [--streams=1] [--rows=16] [--vocab=129280] [--steps=200]
//                    [--source=inline|shm|cuda_ipc] [--mode=unary|stream|channel]
//
// FILE holds protobuf JSON (one SampleRequest, a JSON array, or {"steps": [...]}); "-" reads
// standard input. Exit status: 0 on success, 2 for bad usage, 1 otherwise (reason on stderr).
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "client/load_generator.h"
#include "client/run_local.h"
#include "client/sampler_client.h"
#include "google/protobuf/util/json_util.h"

namespace samplerd {
namespace {

constexpr char kUsage[] =
    "usage: samplerctl COMMAND [FLAGS] [FILE]\n"
    "commands:\n"
    "  run-local FILE      run FILE's steps in-process on the CPU backend (no server)\n"
    "  sample FILE         run FILE's steps on a samplerd (unary calls, or one stream)\n"
    "  info                GetServerInfo, as JSON\n"
    "  health              grpc.health.v1 Check: prints SERVING / NOT_SERVING\n"
    "  bench               a load run: latency percentiles and steps/s\n"
    "flags (default in brackets):\n"
    "  --target=ADDR       [127.0.0.1:50051] samplerd's address (host:port or unix:/path);\n"
    "                      sample, info, health, bench\n"
    "  --timeout_ms=N      [30000] deadline of each unary call; sample, info, health\n"
    "  --tls_ca=FILE       [plaintext] TLS: the CA bundle (PEM) that verifies samplerd;\n"
    "  --tls_cert=FILE --tls_key=FILE  mutual TLS: this client's certificate and key;\n"
    "  --tls_server_name=NAME  the name samplerd's certificate carries, if not the target's\n"
    "                      host; sample, info, health, bench\n"
    "  --threads=N         [0 = all cores] CPU backend threads; run-local\n"
    "  --stream            [off] send FILE's steps on one SampleStream; sample\n"
    "  --service=S         [\"\"] the health service name (\"\" = the server as a whole, or\n"
    "                      samplerd.v1.Sampler); health\n"
    "  --live              [off] exit 0 whenever the server answers, SERVING or NOT_SERVING\n"
    "                      (for liveness probes, which must pass while it drains); health\n"
    "  --streams=N [1] --rows=N [16] --vocab=N [129280] --steps=N [200] --warmup=N [10]\n"
    "  --source=inline|shm|cuda_ipc [inline] --mode=unary|stream|channel [unary]\n"
    "  --device_tokens (cuda_ipc: tokens also written into GPU memory, checked); bench\n"
    "FILE: protobuf JSON, one SampleRequest, an array, or {\"steps\": [...]}; - = stdin\n"
    "exit status: 0 success, 1 failure (reason on stderr), 2 bad usage\n";

// --name=value flags and positional arguments of one command.
struct Args {
  std::map<std::string, std::string> flags;
  std::vector<std::string> positional;
  bool Has(const std::string& name) const { return flags.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
};

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--")) {
      const size_t eq = arg.find('=');
      args.flags[arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
          eq == std::string::npos ? "" : arg.substr(eq + 1);
    } else {
      args.positional.push_back(arg);
    }
  }
  return args;
}

bool IntFlag(const Args& args, const std::string& name, int* value) {
  if (!args.Has(name)) return true;
  if (absl::SimpleAtoi(args.Get(name), value) && *value >= 0) return true;
  std::cerr << "samplerctl: --" << name << " needs a number >= 0\n";
  return false;
}

bool ReadInput(const std::string& path, std::string* text) {
  std::stringstream buffer;
  if (path == "-") {
    buffer << std::cin.rdbuf();
  } else {
    std::ifstream file(path);
    if (!file) {
      std::cerr << "samplerctl: cannot read " << path << "\n";
      return false;
    }
    buffer << file.rdbuf();
  }
  *text = buffer.str();
  return true;
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  std::string out;
  google::protobuf::util::MessageToJsonString(message, &out, print);
  return out;
}

int Fail(const absl::Status& status) {
  std::cerr << "samplerctl: " << status.ToString() << "\n";
  return 1;
}

constexpr char kDefaultTarget[] = "127.0.0.1:50051";  // samplerd's default --listen

// --tls_ca, --tls_cert, --tls_key and --tls_server_name into `options`.
void TlsFlags(const Args& args, ClientOptions* options) {
  options->tls_ca_file = args.Get("tls_ca");
  options->tls_cert_file = args.Get("tls_cert");
  options->tls_key_file = args.Get("tls_key");
  options->tls_server_name = args.Get("tls_server_name");
}

std::unique_ptr<SamplerClient> ConnectOrNull(const Args& args) {
  ClientOptions options;
  TlsFlags(args, &options);
  int timeout_ms = static_cast<int>(options.timeout.count());
  if (!IntFlag(args, "timeout_ms", &timeout_ms)) return nullptr;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  auto client = SamplerClient::Connect(args.Get("target", kDefaultTarget), options);
  if (!client.ok()) {
    Fail(client.status());
    return nullptr;
  }
  return std::move(*client);
}

int RunLocal(const Args& args) {
  RunLocalOptions options;
  if (args.positional.size() != 1 || !IntFlag(args, "threads", &options.num_threads)) {
    std::cerr << kUsage;
    return 2;
  }
  std::string text;
  if (!ReadInput(args.positional[0], &text)) return 1;
  auto out = RunLocalJson(text, options);
  if (!out.ok()) {
    std::cerr << "samplerctl: " << out.status().message() << "\n";
    return 1;
  }
  std::cout << *out << (absl::EndsWith(*out, "\n") ? "" : "\n");
  return 0;
}

int Sample(const Args& args) {
  if (args.positional.size() != 1) {
    std::cerr << kUsage;
    return 2;
  }
  auto client = ConnectOrNull(args);
  if (!client) return 2;
  std::string text;
  if (!ReadInput(args.positional[0], &text)) return 1;
  bool single = false;
  auto steps = ParseStepsJson(text, &single);
  if (!steps.ok()) return Fail(steps.status());
  std::unique_ptr<SamplerClient::StepStream> stream;
  if (args.Has("stream")) {
    auto opened = client->OpenStream();
    if (!opened.ok()) return Fail(opened.status());
    stream = std::move(*opened);
  }
  if (!single) std::cout << "[\n";
  for (int i = 0; i < steps->steps_size(); ++i) {
    auto response = stream ? stream->Step(steps->steps(i)) : client->Sample(steps->steps(i));
    if (!response.ok()) return Fail(response.status());
    std::string json = ToJson(*response);
    while (!json.empty() && json.back() == '\n') json.pop_back();
    std::cout << json << (single ? "\n" : (i + 1 < steps->steps_size() ? ",\n" : "\n"));
  }
  if (!single) std::cout << "]\n";
  if (stream) {
    if (absl::Status closed = stream->Close(); !closed.ok()) return Fail(closed);
  }
  return 0;
}

int Info(const Args& args) {
  auto client = ConnectOrNull(args);
  if (!client) return 2;
  auto info = client->GetServerInfo();
  if (!info.ok()) return Fail(info.status());
  std::cout << ToJson(*info);
  return 0;
}

int Health(const Args& args) {
  auto client = ConnectOrNull(args);
  if (!client) return 2;
  auto serving = client->IsServing(args.Get("service"));
  if (!serving.ok()) return Fail(serving.status());
  std::cout << (*serving ? "SERVING" : "NOT_SERVING") << "\n";
  return *serving || args.Has("live") ? 0 : 1;
}

int Bench(const Args& args) {
  LoadOptions options;
  options.target = args.Get("target", options.target);
  TlsFlags(args, &options.client);
  if (!IntFlag(args, "streams", &options.streams) || !IntFlag(args, "rows", &options.rows) ||
      !IntFlag(args, "vocab", &options.vocab) || !IntFlag(args, "steps", &options.steps) ||
      !IntFlag(args, "warmup", &options.warmup)) {
    return 2;
  }
  const std::optional<samplerd::LoadOptions::Source> source =
      samplerd::ParseSource(args.Get("source", "inline"));
  const std::string mode = args.Get("mode", "unary");
  if (!source.has_value() || (mode != "unary" && mode != "stream" && mode != "channel")) {
    std::cerr << "samplerctl: --source=inline|shm|cuda_ipc, --mode=unary|stream|channel\n";
    return 2;
  }
  options.source = *source;
  options.streaming = mode == "stream";
  options.channel = mode == "channel";
  options.device_tokens = args.Has("device_tokens") && args.Get("device_tokens") != "false";
  if (options.device_tokens && options.source != samplerd::LoadOptions::Source::kCudaIpc) {
    std::cerr << "samplerctl: --device_tokens needs --source=cuda_ipc\n";
    return 2;
  }
  auto report = RunLoad(options);
  if (!report.ok()) return Fail(report.status());
  std::cout << FormatReport(options, *report);
  return 0;
}

}  // namespace
}  // namespace samplerd

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << samplerd::kUsage;
    return 2;
  }
  const std::string command = argv[1];
  const samplerd::Args args = samplerd::ParseArgs(argc, argv);
  if (command == "run-local") return samplerd::RunLocal(args);
  if (command == "sample") return samplerd::Sample(args);
  if (command == "info") return samplerd::Info(args);
  if (command == "health") return samplerd::Health(args);
  if (command == "bench") return samplerd::Bench(args);
  if (command == "help" || command == "--help" || command == "-h") {
    std::cout << samplerd::kUsage;
    return 0;
  }
  std::cerr << "samplerctl: unknown command '" << command << "'\n" << samplerd::kUsage;
  return 2;
}
