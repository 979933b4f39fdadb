// hvtrace-kexec: loads a kernel with kexec_file_load(2) and, unless told
// otherwise, reboots into it at once with reboot(LINUX_REBOOT_CMD_KEXEC).
//
// kexec-tools is dynamically linked and drags a loader into the initramfs;
// this helper is built with `gcc -static -Os` by qemu-scripts/build-guest.sh
// and does only what the kexec tests need. The kernel checks the image
// itself (kexec_file_load parses and, if configured, verifies it), so the
// helper passes file descriptors and a command line, nothing more.
//
// Usage: hvtrace-kexec [--load-only] [--crash] [--unload]
//                      [--append CMDLINE | --reuse-cmdline] KERNEL [INITRD]
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kexec.h>
#include <linux/reboot.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void Usage(void) {
  fprintf(stderr,
          "usage: hvtrace-kexec [--load-only] [--crash] [--unload]\n"
          "                     [--append CMDLINE | --reuse-cmdline] KERNEL "
          "[INITRD]\n"
          "  --load-only      load but do not reboot (e.g. to time the load)\n"
          "  --crash          load as the crash (kdump) kernel; implies "
          "--load-only\n"
          "  --unload         unload the loaded (or crash) kernel and exit\n"
          "  --reuse-cmdline  use this boot's /proc/cmdline\n");
}

static double NowMs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Reads /proc/cmdline into |buf| without its trailing newline.
static int ReadProcCmdline(char* buf, size_t size) {
  int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n < 0) return -1;
  buf[n] = '\0';
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = '\0';
  return 0;
}

int main(int argc, char** argv) {
  int load_only = 0, crash = 0, unload = 0, reuse = 0;
  const char* append = "";
  int i = 1;
  for (; i < argc && strncmp(argv[i], "--", 2) == 0; ++i) {
    if (strcmp(argv[i], "--load-only") == 0) {
      load_only = 1;
    } else if (strcmp(argv[i], "--crash") == 0) {
      crash = 1;
      load_only = 1;
    } else if (strcmp(argv[i], "--unload") == 0) {
      unload = 1;
    } else if (strcmp(argv[i], "--reuse-cmdline") == 0) {
      reuse = 1;
    } else if (strcmp(argv[i], "--append") == 0 && i + 1 < argc) {
      append = argv[++i];
    } else if (strcmp(argv[i], "--") == 0) {
      ++i;
      break;
    } else {
      Usage();
      return 2;
    }
  }
  unsigned long flags = crash ? KEXEC_FILE_ON_CRASH : 0;
  if (unload) {
    if (syscall(SYS_kexec_file_load, -1, -1, 0UL, "", flags | KEXEC_FILE_UNLOAD) != 0) {
      fprintf(stderr, "hvtrace-kexec: unload failed: %s\n", strerror(errno));
      return 1;
    }
    return 0;
  }
  if (i >= argc || argc - i > 2) {
    Usage();
    return 2;
  }
  const char* kernel_path = argv[i];
  const char* initrd_path = i + 1 < argc ? argv[i + 1] : NULL;

  static char cmdline[4096];
  if (reuse) {
    if (ReadProcCmdline(cmdline, sizeof(cmdline)) != 0) {
      fprintf(stderr, "hvtrace-kexec: cannot read /proc/cmdline: %s\n", strerror(errno));
      return 1;
    }
  } else if (strlen(append) >= sizeof(cmdline)) {
    fprintf(stderr, "hvtrace-kexec: command line longer than %zu bytes\n", sizeof(cmdline) - 1);
    return 2;
  } else {
    strcpy(cmdline, append);
  }

  int kernel_fd = open(kernel_path, O_RDONLY | O_CLOEXEC);
  if (kernel_fd < 0) {
    fprintf(stderr, "hvtrace-kexec: open kernel %s: %s\n", kernel_path, strerror(errno));
    return 1;
  }
  int initrd_fd = -1;
  if (initrd_path != NULL) {
    initrd_fd = open(initrd_path, O_RDONLY | O_CLOEXEC);
    if (initrd_fd < 0) {
      fprintf(stderr, "hvtrace-kexec: open initrd %s: %s\n", initrd_path, strerror(errno));
      return 1;
    }
  } else {
    flags |= KEXEC_FILE_NO_INITRAMFS;
  }

  double start = NowMs();
  // The length passed to the kernel counts the terminating NUL.
  if (syscall(SYS_kexec_file_load, kernel_fd, initrd_fd, strlen(cmdline) + 1, cmdline,
              flags) != 0) {
    fprintf(stderr, "hvtrace-kexec: kexec_file_load(%s, %s, \"%s\"%s) failed: %s\n",
            kernel_path, initrd_path ? initrd_path : "no initrd", cmdline,
            crash ? ", crash" : "", strerror(errno));
    return 1;
  }
  fprintf(stderr, "hvtrace-kexec: loaded %s%s in %.0f ms\n", kernel_path,
          crash ? " as crash kernel" : "", NowMs() - start);
  if (load_only) return 0;

  sync();
  syscall(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2, LINUX_REBOOT_CMD_KEXEC, NULL);
  // Only reached when the reboot was refused.
  fprintf(stderr, "hvtrace-kexec: reboot(LINUX_REBOOT_CMD_KEXEC) failed: %s\n", strerror(errno));
  return 1;
}
