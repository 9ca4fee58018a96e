/* The sandbox ("pause") process of podwire's containerd tests: it only holds the pod's
 * namespaces. It exits 0 on SIGINT or SIGTERM and reaps any child it inherits, so a stopped
 * sandbox leaves no zombie. Built statically at test time: the image has no libc. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction stop = {.sa_handler = leave};
    struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
