// Starts samplerd as a child process on a free port (port 0) for end-to-end tests, and stops
// it with a signal. Hermetic: a temp dir per server, loopback only.
//
//   ServerProcess server(samplerd_path, {"--threads=2"});
//   ASSERT_TRUE(server.Start().ok());
//   auto client = SamplerClient::Connect(server.target());
//   int exit_code = server.Stop(SIGTERM);
#ifndef SAMPLERD_TESTS_SERVER_PROCESS_H_
#define SAMPLERD_TESTS_SERVER_PROCESS_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace samplerd {

// Where a spawned child's output goes.
struct SpawnOptions {
  const char* log_file = nullptr;  // stdout and stderr into this file (truncated)
  int stdout_fd = -1;              // stdout onto this descriptor (a pipe's write end)
  int close_fd = -1;               // closed in the child (the pipe's read end)
};

// Starts `args` (args[0] the binary's path) as a child process; returns its pid (-1: fork
// failed). Everything the child needs is built before fork, and the child calls only
// async-signal-safe functions (open, dup2, close, execv, _exit): the tests fork from many
// threads, and a child that allocates can hang for good. Under ASan, samplerd_restart_test's
// restarted samplerd once never started: another thread held the sanitizer's stack-depot lock
// at fork, and the child's argv vector spun on it (1 run in ~20 on 2 cores).
inline pid_t SpawnProcess(std::vector<std::string> args, const SpawnOptions& options = {}) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    if (options.log_file != nullptr) {
      const int fd = open(options.log_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
    }
    if (options.stdout_fd >= 0) dup2(options.stdout_fd, 1);
    if (options.close_fd >= 0) close(options.close_fd);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

class ServerProcess {
 public:
  ServerProcess(std::string binary, std::vector<std::string> flags)
      : binary_(std::move(binary)), flags_(std::move(flags)) {
    char dir_template[] = "/tmp/samplerd-test-XXXXXX";
    dir_ = mkdtemp(dir_template);
  }
  // Kills a server still running, and removes its directory (port file, socket, log): the
  // tests ran thousands of servers into /tmp, and each left its directory behind.
  ~ServerProcess() {
    if (pid_ > 0) Stop(SIGKILL);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Waits at most `timeout_s` for the server's port file.
  absl::Status Start(int timeout_s = 10) {
    const std::string port_file = dir_ + "/port";
    unlink(port_file.c_str());  // a restart must not read the last run's port
    std::vector<std::string> args = {binary_, "--listen=127.0.0.1:0",
                                     "--port_file=" + port_file, "--log_level=warn"};
    if (unix_socket_) args.push_back("--unix_socket=" + unix_socket_path());
    args.insert(args.end(), flags_.begin(), flags_.end());
    SpawnOptions spawn;
    if (!log_file_.empty()) spawn.log_file = log_file_.c_str();
    pid_ = SpawnProcess(std::move(args), spawn);
    if (pid_ < 0) return absl::InternalError("fork failed");
    for (int i = 0; i < 20 * timeout_s; ++i) {
      std::ifstream in(port_file);
      if (in >> port_ >> metrics_port_) return absl::OkStatus();
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError("samplerd exited during start-up");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("samplerd did not write its port file in ", timeout_s, " s"));
  }

  // Sends `signal`, waits, and returns the exit code (128 + signal if killed by one).
  int Stop(int signal) {
    if (pid_ <= 0) return -1;
    kill(pid_, signal);
    return Wait();
  }
  // Waits at most 30 s (a server that hangs on shutdown is a failure, not a hung test), then
  // kills it: the result is then 128 + SIGKILL.
  int Wait() {
    int status = 0;
    for (int i = 0; i < 3000 && waitpid(pid_, &status, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (i == 2999) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void Signal(int signal) { kill(pid_, signal); }

  // Before Start: the server's stdout and stderr go to `path` instead of ours.
  void set_log_file(std::string path) { log_file_ = std::move(path); }
  // Before Start: the server also listens on unix_socket_path(), the same one after a
  // restart (a TCP port 0 would change).
  void set_unix_socket() { unix_socket_ = true; }
  std::string unix_socket_path() const { return dir_ + "/samplerd.sock"; }
  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  pid_t pid() const { return pid_; }
  // The server's resident set and its peak so far (VmRSS, VmHWM of /proc/PID/status), in KiB.
  int64_t RssKib(const char* field = "VmRSS:") const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string key;
    int64_t value = -1;
    while (in >> key) {
      if (key == field) {
        in >> value;
        break;
      }
    }
    return value;
  }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  const std::string& dir() const { return dir_; }

 private:
  const std::string binary_;
  const std::vector<std::string> flags_;
  std::string dir_;
  std::string log_file_;
  bool unix_socket_ = false;
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
};

// The body and headers of an HTTP/1.0 GET of 127.0.0.1:`port``path` ("" when it cannot
// connect): the metrics endpoint.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) out.append(buffer, n);
  close(fd);
  return out;
}

// The value of the unlabelled Prometheus sample `name` in `metrics` text, or -1.
inline double MetricValue(const std::string& metrics, const std::string& name) {
  const size_t at = metrics.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(metrics.c_str() + at + name.size() + 2, nullptr);
}

// Whether the tests run under ThreadSanitizer (.bazelrc's --config=tsan sets
// SAMPLERD_SANITIZER): its shadow memory multiplies what a byte costs, and it runs code tens of
// times slower.
inline bool UnderThreadSanitizer() {
  const char* sanitizer = std::getenv("SAMPLERD_SANITIZER");
  return sanitizer != nullptr && std::string(sanitizer) == "tsan";
}

// Runs `argv` to completion; returns its exit code.
inline int RunProcess(std::vector<std::string> argv) {
  const pid_t pid = SpawnProcess(std::move(argv));
  if (pid < 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace samplerd

#endif  // SAMPLERD_TESTS_SERVER_PROCESS_H_
