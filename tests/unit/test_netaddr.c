/*
 * Which address the back channel listens on for ranks on other nodes
 * (runtime/channel/dk_netaddr.h): the route to the first node, or what the user or
 * the site gives.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dk_netaddr.h"

/* Whether ADDR is an address of this host: a socket can be bound to it. */
static bool bindable(const char *addr)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return false;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    bool ok = bind(fd, (struct sockaddr *) &sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

Test(netaddr, the_route_to_a_loopback_node_leaves_from_loopback)
{
    char out[64], err[256];
    cr_assert_eq(dk_netaddr_route_to("127.0.0.1", out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, "127.0.0.1");
}

Test(netaddr, a_node_named_by_its_name_is_resolved)
{
    char out[64], err[256];
    cr_assert_eq(dk_netaddr_route_to("localhost", out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert(!strcmp(out, "127.0.0.1") || !strcmp(out, "::1"), "%s", out);
}

Test(netaddr, the_route_to_another_network_leaves_from_an_address_of_this_host)
{
    char out[64], err[256];
    /* TEST-NET-1: never a real host, but routed by a default route if any. */
    if (dk_netaddr_route_to("192.0.2.1", out, sizeof out, err, sizeof err) != 0) {
        cr_assert(strstr(err, "no route to the node 192.0.2.1"), "%s", err);
        cr_skip_test("this machine has no default route: %s", err);
    }
    cr_assert(strncmp(out, "127.", 4) != 0, "%s", out);
    cr_assert(bindable(out), "%s is not an address of this host", out);
}

Test(netaddr, an_unknown_node_is_an_error_that_says_what_to_set)
{
    char out[64], err[256] = "";
    cr_assert_eq(dk_netaddr_route_to("no-such-node.invalid", out, sizeof out, err, sizeof err), -1);
    cr_assert(strstr(err, "no-such-node.invalid") && strstr(err, "DISTKERNEL_ADVERTISE_ADDR"),
              "%s", err);
}

static const char *const LOCAL[] = {"127.0.0.1"};

/* A kernel on the allocation's first node: the route to it is loopback, which
 * the second node could not reach; the route to the second one decides. */
Test(netaddr, a_first_node_that_is_this_host_gives_way_to_the_next_node)
{
    char out[64], err[256];
    const char *nodes[] = {"127.0.1.1", "192.0.2.1"};
    if (dk_netaddr_route_to("192.0.2.1", out, sizeof out, err, sizeof err) != 0)
        cr_skip_test("this machine has no default route: %s", err);
    char expected[64];
    snprintf(expected, sizeof expected, "%s", out);
    cr_assert_eq(dk_netaddr_advertise(NULL, nodes, 2, out, sizeof out, err, sizeof err), 0, "%s",
                 err);
    cr_assert_str_eq(out, expected);
    cr_assert(strncmp(out, "127.", 4) != 0, "%s", out);
}

Test(netaddr, loopback_is_the_answer_only_when_every_node_is_this_host)
{
    char out[64], err[256];
    const char *nodes[] = {"127.0.1.1", "localhost"};
    cr_assert_eq(dk_netaddr_advertise(NULL, nodes, 2, out, sizeof out, err, sizeof err), 0, "%s",
                 err);
    cr_assert(!strncmp(out, "127.", 4) || !strcmp(out, "::1"), "%s", out);
}

Test(netaddr, a_node_without_a_route_is_an_error)
{
    char out[64], err[256] = "";
    const char *nodes[] = {"127.0.0.1", "no-such-node.invalid"};
    cr_assert_eq(dk_netaddr_advertise(NULL, nodes, 2, out, sizeof out, err, sizeof err), -1);
    cr_assert(strstr(err, "no-such-node.invalid"), "%s", err);
}

Test(netaddr, the_option_wins_over_the_environment_and_the_route)
{
    setenv("DISTKERNEL_ADVERTISE_ADDR", "127.0.0.3", 1);
    char out[64], err[256];
    cr_assert_eq(dk_netaddr_advertise("127.0.0.5", LOCAL, 1, out, sizeof out, err, sizeof err),
                 0, "%s", err);
    cr_assert_str_eq(out, "127.0.0.5");
    cr_assert_eq(dk_netaddr_advertise(NULL, LOCAL, 1, out, sizeof out, err, sizeof err), 0);
    cr_assert_str_eq(out, "127.0.0.3");
    cr_assert_eq(dk_netaddr_advertise("", LOCAL, 1, out, sizeof out, err, sizeof err), 0);
    cr_assert_str_eq(out, "127.0.0.3");
    unsetenv("DISTKERNEL_ADVERTISE_ADDR");
    cr_assert_eq(dk_netaddr_advertise(NULL, LOCAL, 1, out, sizeof out, err, sizeof err), 0);
    cr_assert_str_eq(out, "127.0.0.1");
    cr_assert_eq(dk_netaddr_advertise("127.0.0.6", LOCAL, 1, out, sizeof out, err, sizeof err), 0);
    cr_assert_str_eq(out, "127.0.0.6");
}

Test(netaddr, a_given_address_must_be_one_of_this_host)
{
    char out[64], err[256] = "";
    /* TEST-NET-1: never an address of this machine */
    cr_assert_eq(dk_netaddr_advertise("192.0.2.7", LOCAL, 1, out, sizeof out, err, sizeof err),
                 -1);
    cr_assert(strstr(err, "advertise_addr is 192.0.2.7, which is not an address of this host"),
              "%s", err);
    setenv("DISTKERNEL_ADVERTISE_ADDR", "192.0.2.7", 1);
    cr_assert_eq(dk_netaddr_advertise(NULL, LOCAL, 1, out, sizeof out, err, sizeof err), -1);
    cr_assert(strstr(err, "DISTKERNEL_ADVERTISE_ADDR is 192.0.2.7"), "%s", err);
}

Test(netaddr, a_given_address_must_be_numeric)
{
    char out[64], err[256] = "";
    cr_assert_eq(dk_netaddr_advertise("node1", LOCAL, 1, out, sizeof out, err, sizeof err), -1);
    cr_assert(strstr(err, "advertise_addr is \"node1\"") && strstr(err, "numeric"), "%s", err);
    setenv("DISTKERNEL_ADVERTISE_ADDR", "10.0.0", 1);
    cr_assert_eq(dk_netaddr_advertise(NULL, LOCAL, 1, out, sizeof out, err, sizeof err), -1);
    cr_assert(strstr(err, "DISTKERNEL_ADVERTISE_ADDR is \"10.0.0\""), "%s", err);
}
