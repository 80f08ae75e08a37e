/*
 * The connection file: what is accepted, what is refused and how the refusal
 * reads, and the endpoints derived from it (protocol/dk_conn.h).
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dk_conn.h"

/* What jupyter_client's write_connection_file produces. */
#define VALID                                                                              \
    "{\"shell_port\": 53001, \"iopub_port\": 53002, \"stdin_port\": 53003,"                \
    " \"control_port\": 53004, \"hb_port\": 53005, \"ip\": \"127.0.0.1\","                \
    " \"key\": \"a0b1c2d3-e4f5\", \"transport\": \"tcp\","                                 \
    " \"signature_scheme\": \"hmac-sha256\", \"kernel_name\": \"distkernel\"}"

#define PORTS                                                                              \
    "\"shell_port\": 1, \"iopub_port\": 2, \"stdin_port\": 3, \"control_port\": 4,"       \
    " \"hb_port\": 5"

static int parse(const char *text, dk_conn_t *conn, char *err, size_t errlen)
{
    err[0] = '\0';
    return dk_conn_parse(text, strlen(text), conn, err, errlen);
}

static bool is_zeroed(const dk_conn_t *conn)
{
    static const dk_conn_t zero;
    return memcmp(conn, &zero, sizeof zero) == 0;
}

/* Parse TEXT, expect a refusal whose message contains NEEDLE. */
static void expect_refused(const char *text, const char *needle)
{
    dk_conn_t conn;
    char err[512];
    memset(&conn, 0x55, sizeof conn);
    cr_assert_eq(parse(text, &conn, err, sizeof err), -1, "accepted: %s", text);
    cr_assert_not_null(strstr(err, needle), "error \"%s\" does not mention %s", err, needle);
    cr_assert(is_zeroed(&conn), "a refused parse must leave the struct empty");
}

Test(conn, parses_a_file_written_by_jupyter_client)
{
    dk_conn_t conn;
    char err[512];
    cr_assert_eq(parse(VALID, &conn, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(conn.transport, "tcp");
    cr_assert_str_eq(conn.ip, "127.0.0.1");
    cr_assert_eq(conn.ports[DK_CHAN_SHELL], 53001);
    cr_assert_eq(conn.ports[DK_CHAN_IOPUB], 53002);
    cr_assert_eq(conn.ports[DK_CHAN_STDIN], 53003);
    cr_assert_eq(conn.ports[DK_CHAN_CONTROL], 53004);
    cr_assert_eq(conn.ports[DK_CHAN_HB], 53005);
    cr_assert_str_eq(conn.key, "a0b1c2d3-e4f5");
    cr_assert_eq(conn.key_len, 13);
    cr_assert_str_eq(conn.kernel_name, "distkernel");
    dk_conn_clear(&conn);
    cr_assert(is_zeroed(&conn));
}

Test(conn, loads_a_file_from_disk)
{
    char path[] = "/tmp/dk-conn-test-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, VALID, strlen(VALID)), (ssize_t) strlen(VALID));
    close(fd);
    dk_conn_t conn;
    char err[512] = "";
    int rc = dk_conn_load(path, &conn, err, sizeof err);
    unlink(path);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(conn.ports[DK_CHAN_HB], 53005);
    dk_conn_clear(&conn);
}

Test(conn, nonexistent_file_error_names_the_path)
{
    dk_conn_t conn;
    char err[512] = "";
    const char *path = "/nonexistent/dir/kernel-1234.json";
    cr_assert_eq(dk_conn_load(path, &conn, err, sizeof err), -1);
    cr_assert_not_null(strstr(err, path), "%s", err);
    cr_assert_not_null(strstr(err, "No such file"), "%s", err);
    cr_assert(is_zeroed(&conn));
}

Test(conn, ports_may_be_integers_or_decimal_strings)
{
    dk_conn_t conn;
    char err[512];
    const char *text = "{\"shell_port\": \"9001\", \"iopub_port\": 9002, \"stdin_port\": 9003,"
                       " \"control_port\": 9004, \"hb_port\": 65535, \"ip\": \"0.0.0.0\","
                       " \"key\": \"\"}";
    cr_assert_eq(parse(text, &conn, err, sizeof err), 0, "%s", err);
    cr_assert_eq(conn.ports[DK_CHAN_SHELL], 9001);
    cr_assert_eq(conn.ports[DK_CHAN_HB], 65535);
    dk_conn_clear(&conn);
}

Test(conn, refuses_a_missing_port)
{
    expect_refused("{\"shell_port\": 1, \"iopub_port\": 2, \"stdin_port\": 3,"
                   " \"control_port\": 4, \"ip\": \"127.0.0.1\", \"key\": \"\"}",
                   "missing \"hb_port\"");
}

Test(conn, refuses_a_bad_port)
{
    const char *bad[] = {"0", "-1", "65536", "70000", "1.5", "\"abc\"", "\"\"", "null",
                         "true", "\"123456\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "{\"shell_port\": %s, \"iopub_port\": 2, \"stdin_port\": 3,"
                 " \"control_port\": 4, \"hb_port\": 5, \"ip\": \"127.0.0.1\", \"key\": \"\"}",
                 bad[i]);
        expect_refused(text, "\"shell_port\"");
        expect_refused(text, "expected an integer port 1-65535");
    }
}

Test(conn, refuses_a_missing_key)
{
    expect_refused("{" PORTS ", \"ip\": \"127.0.0.1\", \"signature_scheme\": \"hmac-sha256\"}",
                   "missing \"key\"");
}

Test(conn, refuses_a_missing_ip)
{
    expect_refused("{" PORTS ", \"key\": \"\"}", "missing \"ip\"");
}

/* Finding 6 of issue 11: the spec allows any hmac-* scheme, and a file without
 * one means jupyter_client's default, hmac-sha256. */
static void expect_digest(const char *scheme_field, const char *digest)
{
    char text[512];
    snprintf(text, sizeof text, "{" PORTS ", \"ip\": \"127.0.0.1\", \"key\": \"k\"%s}",
             scheme_field);
    dk_conn_t conn;
    char err[512];
    cr_assert_eq(parse(text, &conn, err, sizeof err), 0, "%s: %s", text, err);
    cr_assert_str_eq(conn.digest, digest);
    dk_conn_clear(&conn);
}

Test(conn, accepts_every_hmac_scheme_openssl_provides)
{
    expect_digest(", \"signature_scheme\": \"hmac-sha256\"", "sha256");
    expect_digest(", \"signature_scheme\": \"hmac-sha512\"", "sha512");
    expect_digest(", \"signature_scheme\": \"hmac-sha384\"", "sha384");
    expect_digest(", \"signature_scheme\": \"hmac-sha1\"", "sha1");
    expect_digest(", \"signature_scheme\": \"hmac-sha3_256\"", "sha3_256");
}

Test(conn, a_missing_scheme_means_hmac_sha256)
{
    expect_digest("", "sha256");
}

Test(conn, refuses_a_scheme_that_is_not_an_hmac_openssl_has)
{
    expect_refused("{" PORTS ", \"ip\": \"127.0.0.1\", \"key\": \"k\","
                   " \"signature_scheme\": \"hmac-nosuch\"}",
                   "\"signature_scheme\" is \"hmac-nosuch\", expected \"hmac-\" and a digest");
    expect_refused("{" PORTS ", \"ip\": \"127.0.0.1\", \"key\": \"k\","
                   " \"signature_scheme\": \"sha256\"}",
                   "\"signature_scheme\" is \"sha256\"");
    /* An extendable-output function has no fixed length to sign with. */
    expect_refused("{" PORTS ", \"ip\": \"127.0.0.1\", \"key\": \"k\","
                   " \"signature_scheme\": \"hmac-shake256\"}",
                   "\"signature_scheme\" is \"hmac-shake256\"");
}

Test(conn, accepts_an_empty_key_without_a_scheme)
{
    dk_conn_t conn;
    char err[512];
    cr_assert_eq(parse("{" PORTS ", \"ip\": \"127.0.0.1\", \"key\": \"\"}", &conn, err,
                       sizeof err), 0, "%s", err);
    cr_assert_str_eq(conn.key, "");
    cr_assert_eq(conn.key_len, 0);
    cr_assert_str_eq(conn.transport, "tcp", "transport defaults to tcp");
    cr_assert_str_eq(conn.kernel_name, "");
    dk_conn_clear(&conn);
}

Test(conn, refuses_an_unknown_transport)
{
    expect_refused("{" PORTS ", \"ip\": \"127.0.0.1\", \"key\": \"\", \"transport\": \"udp\"}",
                   "\"transport\" is \"udp\", expected \"tcp\" or \"ipc\"");
}

Test(conn, refuses_text_that_is_not_a_json_object)
{
    expect_refused("{\"shell_port\": ", "not valid JSON");
    expect_refused("", "not valid JSON");
    expect_refused("[1, 2, 3]", "expected a JSON object");
}

Test(conn, refuses_fields_of_the_wrong_type)
{
    expect_refused("{" PORTS ", \"ip\": 127, \"key\": \"\"}", "\"ip\" must be a string");
    expect_refused("{" PORTS ", \"ip\": \"127.0.0.1\", \"key\": 5}", "\"key\" must be a string");
}

Test(conn, tcp_endpoint_is_ip_colon_port)
{
    dk_conn_t conn;
    char err[512], buf[128];
    cr_assert_eq(parse(VALID, &conn, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(dk_conn_endpoint(&conn, DK_CHAN_SHELL, buf, sizeof buf),
                     "tcp://127.0.0.1:53001");
    cr_assert_str_eq(dk_conn_endpoint(&conn, DK_CHAN_HB, buf, sizeof buf),
                     "tcp://127.0.0.1:53005");
    dk_conn_clear(&conn);
}

Test(conn, ipc_endpoint_is_path_dash_port)
{
    dk_conn_t conn;
    char err[512], buf[128];
    cr_assert_eq(parse("{" PORTS ", \"ip\": \"/tmp/kernel-ipc\", \"key\": \"\","
                       " \"transport\": \"ipc\"}", &conn, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(dk_conn_endpoint(&conn, DK_CHAN_IOPUB, buf, sizeof buf),
                     "ipc:///tmp/kernel-ipc-2");
    dk_conn_clear(&conn);
}

Test(conn, endpoint_refuses_a_buffer_too_small)
{
    dk_conn_t conn;
    char err[512], buf[64];
    size_t needed = strlen("tcp://127.0.0.1:53001") + 1;
    cr_assert_eq(parse(VALID, &conn, err, sizeof err), 0, "%s", err);
    cr_assert_null(dk_conn_endpoint(&conn, DK_CHAN_SHELL, buf, needed - 1));
    cr_assert_not_null(dk_conn_endpoint(&conn, DK_CHAN_SHELL, buf, needed));
    cr_assert_null(dk_conn_endpoint(&conn, DK_CHAN_COUNT, buf, sizeof buf));
    dk_conn_clear(&conn);
}

Test(conn, clear_is_safe_on_a_zeroed_struct)
{
    dk_conn_t conn;
    memset(&conn, 0, sizeof conn);
    dk_conn_clear(&conn);
    dk_conn_clear(&conn);
    cr_assert(is_zeroed(&conn));
}

Test(conn, channels_have_names_for_logs)
{
    cr_assert_str_eq(dk_channel_name(DK_CHAN_SHELL), "shell");
    cr_assert_str_eq(dk_channel_name(DK_CHAN_IOPUB), "iopub");
    cr_assert_str_eq(dk_channel_name(DK_CHAN_STDIN), "stdin");
    cr_assert_str_eq(dk_channel_name(DK_CHAN_CONTROL), "control");
    cr_assert_str_eq(dk_channel_name(DK_CHAN_HB), "hb");
    cr_assert_str_eq(dk_channel_name(DK_CHAN_COUNT), "unknown");
}

Test(conn, error_is_truncated_to_the_buffer_and_terminated)
{
    dk_conn_t conn;
    char err[8];
    memset(err, 'x', sizeof err);
    cr_assert_eq(dk_conn_parse("{}", 2, &conn, err, sizeof err), -1);
    cr_assert_eq(strlen(err), sizeof err - 1);
}

/* Finding 6 of issue 11: what ZeroMQ is asked to bind. It takes numeric
 * addresses only, and IPv6 only when told. */
static void expect_bind(const char *ip, const char *endpoint, bool ipv6)
{
    char text[512];
    snprintf(text, sizeof text, "{" PORTS ", \"ip\": \"%s\", \"key\": \"\"}", ip);
    dk_conn_t conn;
    char err[512] = "", buf[300];
    cr_assert_eq(parse(text, &conn, err, sizeof err), 0, "%s", err);
    bool v6 = !ipv6;
    cr_assert_not_null(dk_conn_bind_endpoint(&conn, DK_CHAN_SHELL, buf, sizeof buf, &v6, err,
                                             sizeof err), "%s: %s", ip, err);
    cr_assert_str_eq(buf, endpoint, "%s", ip);
    cr_assert_eq(v6, ipv6, "%s", ip);
    dk_conn_clear(&conn);
}

Test(conn, bind_endpoints_for_names_and_ipv6)
{
    expect_bind("127.0.0.1", "tcp://127.0.0.1:1", false);
    expect_bind("*", "tcp://*:1", false);
    expect_bind("localhost", "tcp://127.0.0.1:1", false);
    expect_bind("::1", "tcp://[::1]:1", true);
    expect_bind("[::1]", "tcp://[::1]:1", true);
    expect_bind("::", "tcp://[::]:1", true);
}
