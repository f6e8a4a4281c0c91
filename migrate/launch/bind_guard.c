/* dpmigrate's bind guard: a listener that asks for every interface gets one address instead.
 *
 * Why: on several nodes, Paddle 3.3.1's TCPStore (global rank 0) binds 0.0.0.0 and TensorFlow 2.21's gRPC
 * servers bind [::], with no option to bind one address; both serve without authentication. Loaded into a
 * job's processes with LD_PRELOAD (by `dpmigrate launch --nnodes M`, see bind_guard.py), this bind() turns
 * a TCP bind to the wildcard address (0.0.0.0, or :: for an IPv6 socket) into a bind to
 * DPMIGRATE_BIND_ADDRESS, the address the launcher chose towards the master, port unchanged. A dual-stack
 * IPv6 socket (IPV6_V6ONLY off, gRPC's wildcard) given an IPv4 address is bound to its IPv4-mapped form
 * (::ffff:a.b.c.d); an IPv6-only one, whose program binds an IPv4 twin at the same port for IPv4, to ::1,
 * so it stays off the network and does not take the twin's port. Everything else (UDP, Unix sockets, a specific address,
 * DPMIGRATE_BIND_ADDRESS unset or not an address) goes to the C library's bind() unchanged.
 * Compiled when dpmigrate is installed (setup.py: dpmigrate/launch/_bind_guard.so), or, where that could
 * not be done, when a multi-node job starts (bind_guard.py).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_function)(int, const struct sockaddr *, socklen_t);

static bind_function real_bind;
static int have_v4, have_v6;
static struct in_addr chosen_v4;
static struct in6_addr chosen_v6;

__attribute__((constructor)) static void read_chosen_address(void) {
    real_bind = (bind_function)dlsym(RTLD_NEXT, "bind");
    const char *chosen = getenv("DPMIGRATE_BIND_ADDRESS");
    if (chosen == NULL) return;
    if (inet_pton(AF_INET, chosen, &chosen_v4) == 1) {
        have_v4 = 1;
        memset(&chosen_v6, 0, sizeof chosen_v6);  /* the IPv4-mapped form, for IPv6 sockets */
        chosen_v6.s6_addr[10] = 0xff;
        chosen_v6.s6_addr[11] = 0xff;
        memcpy(&chosen_v6.s6_addr[12], &chosen_v4, 4);
        have_v6 = 1;
    } else if (inet_pton(AF_INET6, chosen, &chosen_v6) == 1) {
        have_v6 = 1;
    }
}

static int is_stream_socket(int fd) {
    int type = 0;
    socklen_t size = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &size) == 0 && type == SOCK_STREAM;
}

int bind(int fd, const struct sockaddr *address, socklen_t size) {
    if (real_bind == NULL) real_bind = (bind_function)dlsym(RTLD_NEXT, "bind");
    if (real_bind == NULL) {
        errno = ENOSYS;
        return -1;
    }
    if (address == NULL || !is_stream_socket(fd)) return real_bind(fd, address, size);
    if (address->sa_family == AF_INET && have_v4 && size >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in given;
        memcpy(&given, address, sizeof given);
        if (given.sin_addr.s_addr == htonl(INADDR_ANY)) {
            given.sin_addr = chosen_v4;
            return real_bind(fd, (const struct sockaddr *)&given, sizeof given);
        }
    } else if (address->sa_family == AF_INET6 && have_v6 && size >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 given;
        memcpy(&given, address, sizeof given);
        if (IN6_IS_ADDR_UNSPECIFIED(&given.sin6_addr)) {
            given.sin6_addr = chosen_v6;
            if (have_v4) {
                int v6only = 0;
                socklen_t length = sizeof v6only;
                if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &length) == 0 && v6only)
                    given.sin6_addr = in6addr_loopback;  /* IPv6 only (its IPv4 twin gets the address): off the network */
            }
            return real_bind(fd, (const struct sockaddr *)&given, sizeof given);
        }
    }
    return real_bind(fd, address, size);
}
