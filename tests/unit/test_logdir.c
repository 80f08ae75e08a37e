/*
 * Log directories on a shared machine and their retention (runtime/logs/dk_logdir.h).
 *
 * Each test works in a fresh directory under /tmp. Tests that need a directory
 * or link owned by another user use chown, so they need root (CI runs as root)
 * and are skipped otherwise; the others hold for any user.
 */
#include <criterion/criterion.h>

#include "dk_codepath.h"
#include "dk_logdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tmp_base.h"

#define OTHER_UID 65534   /* nobody */

static char err[1024];

static void setup(void)
{
    tmp_base_make("logdir");
}

TestSuite(logdir, .init = setup, .fini = tmp_base_remove);

/* ---- the root -------------------------------------------------------------- */

Test(logdir, missing_components_are_created_private_to_the_user)
{
    int fd = dk_logdir_open(at("a/b/logs"), DK_LOGDIR_CREATE, NULL, err, sizeof err);
    cr_assert_geq(fd, 0, "%s", err);
    struct stat st;
    cr_assert_eq(stat(at("a/b/logs"), &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    cr_assert_eq(stat(at("a"), &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    close(fd);
}

Test(logdir, a_root_writable_by_others_is_refused_with_the_hint)
{
    cr_assert_eq(mkdir(at("open"), 0777), 0);
    cr_assert_eq(chmod(at("open"), 0777), 0);
    int fd = dk_logdir_open(at("open"), DK_LOGDIR_CREATE, "set DISTKERNEL_LOG_DIR", err,
                            sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert(strstr(err, "writable by other users") && strstr(err, "DISTKERNEL_LOG_DIR"),
              "%s", err);
}

Test(logdir, a_component_writable_by_others_without_the_sticky_bit_is_refused)
{
    cr_assert_eq(mkdir(at("open"), 0777), 0);
    cr_assert_eq(chmod(at("open"), 0777), 0);
    int fd = dk_logdir_open(at("open/logs"), DK_LOGDIR_CREATE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert(strstr(err, "writable by other users"), "%s", err);
    cr_assert(!exists(at("open/logs")), "nothing is created under an unsafe directory");
}

Test(logdir, a_sticky_shared_directory_like_tmp_is_a_safe_parent)
{
    cr_assert_eq(mkdir(at("shared"), 0777), 0);
    cr_assert_eq(chmod(at("shared"), 01777), 0);
    int fd = dk_logdir_open(at("shared/logs"), DK_LOGDIR_CREATE, NULL, err, sizeof err);
    cr_assert_geq(fd, 0, "%s", err);
    close(fd);
}

Test(logdir, a_root_of_another_user_is_refused)
{
    if (geteuid() != 0)
        cr_skip_test("chown needs root");
    cr_assert_eq(mkdir(at("theirs"), 0700), 0);
    cr_assert_eq(chown(at("theirs"), OTHER_UID, OTHER_UID), 0);
    int fd = dk_logdir_open(at("theirs"), DK_LOGDIR_CREATE, "set DISTKERNEL_LOG_DIR", err,
                            sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert(strstr(err, "belongs to another user") && strstr(err, "DISTKERNEL_LOG_DIR"),
              "%s", err);
}

Test(logdir, a_symlink_planted_by_another_user_is_not_followed)
{
    if (geteuid() != 0)
        cr_skip_test("lchown needs root");
    cr_assert_eq(mkdir(at("elsewhere"), 0700), 0);
    cr_assert_eq(symlink(at("elsewhere"), at("logs")), 0);
    cr_assert_eq(lchown(at("logs"), OTHER_UID, OTHER_UID), 0);
    int fd = dk_logdir_open(at("logs"), DK_LOGDIR_CREATE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert(strstr(err, "symlink owned by another user"), "%s", err);
}

Test(logdir, the_users_own_symlink_is_followed)
{
    cr_assert_eq(mkdir(at("real"), 0700), 0);
    cr_assert_eq(symlink(at("real"), at("home")), 0);
    int fd = dk_logdir_open(at("home/logs"), DK_LOGDIR_CREATE, NULL, err, sizeof err);
    cr_assert_geq(fd, 0, "%s", err);
    cr_assert(exists(at("real/logs")));
    close(fd);
}

Test(logdir, the_default_root_is_the_users_state_directory)
{
    unsetenv("DISTKERNEL_LOG_DIR");
    setenv("XDG_STATE_HOME", "/somewhere/state", 1);
    char *p = dk_logdir_default_root(err, sizeof err);
    cr_assert_str_eq(p, "/somewhere/state/distkernel/logs");
    free(p);
    unsetenv("XDG_STATE_HOME");
    setenv("HOME", "/home/someone", 1);
    p = dk_logdir_default_root(err, sizeof err);
    cr_assert_str_eq(p, "/home/someone/.local/state/distkernel/logs");
    free(p);
    setenv("DISTKERNEL_LOG_DIR", "/chosen", 1);
    p = dk_logdir_default_root(err, sizeof err);
    cr_assert_str_eq(p, "/chosen");
    free(p);
}

/* ---- files and removal --------------------------------------------------- */

Test(logdir, creating_a_file_never_follows_or_reuses_an_existing_entry)
{
    int root = dk_logdir_open(base, 0, NULL, err, sizeof err);
    cr_assert_geq(root, 0, "%s", err);
    write_file(at("victim"), "precious\n");
    cr_assert_eq(symlink(at("victim"), at("rank-0.log")), 0);
    cr_assert_lt(dk_logdir_create(root, "rank-0.log", err, sizeof err), 0);
    char *text = read_file(at("victim"), NULL);
    cr_assert_str_eq(text, "precious\n");
    free(text);
    close(root);
}

Test(logdir, removal_removes_a_symlink_not_what_it_points_at)
{
    cr_assert_eq(mkdir(at("outside"), 0700), 0);
    write_file(at("outside/rank-0.log"), "keep me\n");
    cr_assert_eq(mkdir(at("root"), 0700), 0);
    cr_assert_eq(mkdir(at("root/run-1"), 0700), 0);
    write_file(at("root/run-1/rank-0.log"), "old\n");
    cr_assert_eq(symlink(at("outside"), at("root/run-1/sub")), 0);
    cr_assert_eq(symlink(at("outside"), at("root/run-2")), 0);
    int root = open(at("root"), O_RDONLY | O_DIRECTORY);
    cr_assert_eq(dk_logdir_remove(root, "run-1"), 0);
    cr_assert_eq(dk_logdir_remove(root, "run-2"), 0);
    cr_assert(!exists(at("root/run-1")) && !exists(at("root/run-2")));
    cr_assert(exists(at("outside/rank-0.log")));
    close(root);
}

/* ---- pruning --------------------------------------------------------------- */

static void make_run(const char *kernel, const char *run, size_t bytes, time_t mtime)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", base, kernel);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/%s/%s", base, kernel, run);
    cr_assert_eq(mkdir(path, 0700), 0);
    char file[600];
    snprintf(file, sizeof file, "%s/rank-0.log", path);
    FILE *f = fopen(file, "w");
    char *buf = calloc(1, bytes);
    memset(buf, 'x', bytes);
    fwrite(buf, 1, bytes, f);
    fclose(f);
    free(buf);
    struct timeval tv[2] = {{mtime, 0}, {mtime, 0}};
    utimes(path, tv);
}

/* A pid that is not running (the biggest pid_max allows is 2^22). */
#define DEAD "kernel-4194303"

Test(logdir, the_root_cap_removes_the_oldest_runs_first_and_never_a_held_one)
{
    time_t now = time(NULL);
    char self[64];
    snprintf(self, sizeof self, "kernel-%d", (int) getpid());
    make_run(DEAD, "run-0001-a", 64 << 10, now - 500);
    make_run(self, "run-0001-b", 64 << 10, now - 400);     /* held: running */
    make_run(self, "run-0002-c", 64 << 10, now - 300);
    make_run(self, "run-0003-d", 64 << 10, now - 200);
    char path[512];
    snprintf(path, sizeof path, "%s/%s/run-0001-b", base, self);
    int run = open(path, O_RDONLY | O_DIRECTORY);
    cr_assert_eq(dk_logdir_hold(run), 0);
    int root = open(base, O_RDONLY | O_DIRECTORY);
    dk_logdir_policy_t policy = {.keep_dead_kernels = 10, .dead_age_s = 86400,
                                 .cap = 160 << 10};
    int removed = dk_logdir_prune(root, &policy, getpid(), NULL);
    cr_assert_eq(removed, 2);
    cr_assert(!exists(at(DEAD)), "an exited kernel's folder left empty goes");
    cr_assert(exists(path), "a held run is never removed");
    snprintf(path, sizeof path, "%s/%s/run-0002-c", base, self);
    cr_assert(!exists(path));
    snprintf(path, sizeof path, "%s/%s/run-0003-d", base, self);
    cr_assert(exists(path), "the newest run stays once the root is under its cap");
    close(run);
    close(root);
}

Test(logdir, folders_of_exited_kernels_go_beyond_the_newest_once_old)
{
    time_t now = time(NULL);
    make_run("kernel-4194301", "run-0001-a", 10, now - 3 * 86400);
    make_run("kernel-4194302", "run-0001-a", 10, now - 2 * 86400);
    make_run(DEAD, "run-0001-a", 10, now - 60);
    struct timeval old[2] = {{now - 3 * 86400, 0}, {now - 3 * 86400, 0}};
    utimes(at("kernel-4194301"), old);
    struct timeval mid[2] = {{now - 2 * 86400, 0}, {now - 2 * 86400, 0}};
    utimes(at("kernel-4194302"), mid);
    int root = open(base, O_RDONLY | O_DIRECTORY);
    dk_logdir_policy_t policy = {.keep_dead_kernels = 1, .dead_age_s = 86400};
    dk_logdir_prune(root, &policy, getpid(), NULL);
    cr_assert(exists(at(DEAD)), "the newest stays");
    cr_assert(!exists(at("kernel-4194301")) && !exists(at("kernel-4194302")));
    close(root);
}

/* ---- socket directories ------------------------------------------------------- */

Test(logdir, a_socket_directory_is_fresh_private_and_under_tmpdir)
{
    cr_assert_eq(mkdir(at("t"), 0700), 0);
    setenv("TMPDIR", at("t"), 1);
    char *dir = dk_logdir_socket_dir("test", "sock", "the test's directory", err, sizeof err);
    cr_assert_not_null(dir, "%s", err);
    cr_assert(strncmp(dir, at("t/distkernel-test-"), strlen(at("t/distkernel-test-"))) == 0,
              "%s", dir);
    struct stat st;
    cr_assert_eq(stat(dir, &st), 0);
    cr_assert(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    char *again = dk_logdir_socket_dir("test", "sock", "the test's directory", err, sizeof err);
    cr_assert_not_null(again, "%s", err);
    cr_assert_str_neq(again, dir);
    dk_logdir_socket_dir_remove(again);
    dk_logdir_socket_dir_remove(dir);
    cr_assert_neq(access(dir, F_OK), 0, "%s was not removed", dir);
    free(again);
    free(dir);
}

Test(logdir, a_tmpdir_too_long_for_a_socket_path_falls_back_to_tmp)
{
    char longdir[200];
    memset(longdir, 'x', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = '\0';
    setenv("TMPDIR", longdir, 1);
    char *dir = dk_logdir_socket_dir("test", "sock", "the test's directory", err, sizeof err);
    cr_assert_not_null(dir, "%s", err);
    cr_assert(strncmp(dir, "/tmp/distkernel-test-", 21) == 0, "%s", dir);
    dk_logdir_socket_dir_remove(dir);
    free(dir);
}

/* A folder like those dk_logdir_socket_dir makes, NAME in BASE/t: with an
 * owner file (unlocked) or not, a socket's file, and its time AGE_S ago. */
static void planted(const char *name, bool owner, int age_s)
{
    char path[512];
    snprintf(path, sizeof path, "%s/t/%s", base, name);
    cr_assert_eq(mkdir(path, 0700), 0, "%s", path);
    char file[600];
    snprintf(file, sizeof file, "%s/relay.sock", path);
    close(open(file, O_CREAT | O_WRONLY, 0600));
    if (owner) {
        snprintf(file, sizeof file, "%s/.owner", path);
        close(open(file, O_CREAT | O_WRONLY, 0600));
    }
    struct timespec when[2] = {{time(NULL) - age_s, 0}, {time(NULL) - age_s, 0}};
    cr_assert_eq(utimensat(AT_FDCWD, path, when, 0), 0);
}

/* A node agent SIGKILLed with its Slurm step takes its folder watcher with
 * it: its folders stay, unlocked. The next start on that node removes them,
 * and nothing whose owner lives, nothing young, nothing without an owner file
 * (an older distkernel's). */
Test(logdir, a_socket_folder_whose_owner_died_with_its_watcher_goes_at_the_next_start)
{
    cr_assert_eq(mkdir(at("t"), 0700), 0);
    setenv("TMPDIR", at("t"), 1);
    planted("distkernel-relay-dead01", true, 120);
    planted("distkernel-relay-live01", true, 120);
    planted("distkernel-relay-young1", true, 5);
    planted("distkernel-relay-older1", false, 120);
    planted("someone-elses-folder", true, 120);
    /* The live one's owner holds its lock (another open of the file: flock
     * locks conflict between opens, in one process too). */
    int held = open(at("t/distkernel-relay-live01/.owner"), O_RDONLY);
    cr_assert(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0);
    char *dir = dk_logdir_socket_dir("relay", "relay.sock", "the test's folder", err, sizeof err);
    cr_assert_not_null(dir, "%s", err);
    cr_assert_neq(access(at("t/distkernel-relay-dead01"), F_OK), 0, "the dead folder stayed");
    cr_assert_eq(access(at("t/distkernel-relay-live01/relay.sock"), F_OK), 0);
    cr_assert_eq(access(at("t/distkernel-relay-young1/relay.sock"), F_OK), 0);
    cr_assert_eq(access(at("t/distkernel-relay-older1/relay.sock"), F_OK), 0);
    cr_assert_eq(access(at("t/someone-elses-folder/relay.sock"), F_OK), 0);
    /* The new folder's owner lock is held by this process for its life. */
    char owner[600];
    snprintf(owner, sizeof owner, "%s/.owner", dir);
    int probe = open(owner, O_RDONLY);
    cr_assert(probe >= 0, "%s: %s", owner, strerror(errno));
    cr_assert_neq(flock(probe, LOCK_EX | LOCK_NB), 0, "nobody holds the new folder's lock");
    close(probe);
    dk_logdir_socket_dir_remove(dir);
    cr_assert_neq(access(dir, F_OK), 0, "%s was not removed", dir);
    close(held);
    free(dir);
}

/* Past the 64 owner locks a process holds, a folder gets no owner file: one
 * that nobody holds would be taken for a dead owner's and swept while it
 * serves. */
Test(logdir, a_folder_past_the_owner_locks_has_no_owner_file_so_is_never_swept)
{
    cr_assert_eq(mkdir(at("t"), 0700), 0);
    setenv("TMPDIR", at("t"), 1);
    char *dirs[70];
    int owned = 0;
    for (int i = 0; i < 70; i++) {
        dirs[i] = dk_logdir_socket_dir("many", "sock", "the test's folder", err, sizeof err);
        cr_assert_not_null(dirs[i], "%s", err);
        char owner[600];
        snprintf(owner, sizeof owner, "%s/.owner", dirs[i]);
        int fd = open(owner, O_RDONLY);
        if (fd >= 0) {
            owned++;
            cr_assert_neq(flock(fd, LOCK_EX | LOCK_NB), 0, "%s: an owner file nobody holds",
                          dirs[i]);
            close(fd);
        }
    }
    cr_assert_eq(owned, 64);
    for (int i = 0; i < 70; i++) {
        dk_logdir_socket_dir_remove(dirs[i]);
        cr_assert_neq(access(dirs[i], F_OK), 0, "%s was not removed", dirs[i]);
        free(dirs[i]);
    }
}

/* A socket folder made under /tmp, with nothing left in TMPDIR. */
static void expect_under_tmp_not(const char *tmpdir)
{
    char *dir = dk_logdir_socket_dir("test", "sock", "the test's directory", err, sizeof err);
    cr_assert_not_null(dir, "%s", err);
    cr_assert(strncmp(dir, "/tmp/distkernel-test-", 21) == 0, "%s", dir);
    struct stat st;
    cr_assert_eq(stat(dir, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    cr_assert_eq(st.st_uid, geteuid());
    dk_logdir_socket_dir_remove(dir);
    free(dir);
    DIR *d = opendir(tmpdir);
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d));)
        cr_assert(e->d_name[0] == '.', "left in TMPDIR: %s", e->d_name);
    closedir(d);
}

/* Issue 38, item 3: a TMPDIR another user made on a node failed every rank
 * there; a refused TMPDIR now gives way to /tmp, as a missing one does. */
Test(logdir, a_tmpdir_others_can_write_gives_way_to_a_fresh_folder_under_tmp)
{
    cr_assert_eq(mkdir(at("open"), 0777), 0);
    cr_assert_eq(chmod(at("open"), 0777), 0);
    setenv("TMPDIR", at("open"), 1);
    expect_under_tmp_not(at("open"));
}

Test(logdir, a_tmpdir_of_another_user_gives_way_to_a_fresh_folder_under_tmp)
{
    if (geteuid() != 0)
        cr_skip_test("chown needs root");
    cr_assert_eq(mkdir(at("theirs"), 0700), 0);
    cr_assert_eq(chown(at("theirs"), OTHER_UID, OTHER_UID), 0);
    setenv("TMPDIR", at("theirs"), 1);
    expect_under_tmp_not(at("theirs"));
}

/* ---- places code is read from (DK_LOGDIR_CODE: a remote rank's folders) ---- */

Test(logdir, code_may_come_from_a_folder_of_the_user_or_of_root)
{
    cr_assert_eq(mkdir(at("proj"), 0755), 0);
    int fd = dk_logdir_open(at("proj"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_geq(fd, 0, "%s", err);
    close(fd);
    /* a system folder: root's, writable by root alone (/ and /usr are too) */
    fd = dk_logdir_open("/usr/lib", DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_geq(fd, 0, "%s", err);
    close(fd);
}

Test(logdir, code_may_come_from_a_zip_file_on_sys_path)
{
    cr_assert_eq(mkdir(at("lib"), 0755), 0);
    int fd = open(at("lib/pkgs.zip"), O_CREAT | O_WRONLY, 0644);
    cr_assert_geq(fd, 0);
    close(fd);
    fd = dk_logdir_open(at("lib/pkgs.zip"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_geq(fd, 0, "%s", err);
    close(fd);
    /* a log root is a folder, still */
    fd = dk_logdir_open(at("lib/pkgs.zip"), 0, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
}

Test(logdir, code_is_not_taken_from_a_folder_others_can_add_files_to_even_sticky)
{
    cr_assert_eq(mkdir(at("scratch"), 0777), 0);
    cr_assert_eq(chmod(at("scratch"), 01777), 0);
    int fd = dk_logdir_open(at("scratch"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert_eq(errno, EACCES);
    cr_assert(strstr(err, "for code") && strstr(err, "writable by other users"), "%s", err);
    /* ... though such a folder (/tmp) is a safe parent of one of the user's */
    cr_assert_eq(mkdir(at("scratch/proj"), 0700), 0);
    fd = dk_logdir_open(at("scratch/proj"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_geq(fd, 0, "%s", err);
    close(fd);
    fd = dk_logdir_open("/tmp", DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0, "/tmp is a place for code");
}

Test(logdir, code_is_not_taken_from_a_group_writable_folder)
{
    cr_assert_eq(mkdir(at("team"), 0775), 0);
    cr_assert_eq(chmod(at("team"), 0775), 0);
    int fd = dk_logdir_open(at("team"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert(strstr(err, "writable by other users"), "%s", err);
}

Test(logdir, code_is_not_taken_from_a_folder_or_file_of_another_user)
{
    if (geteuid() != 0)
        cr_skip_test("chown needs root");
    cr_assert_eq(mkdir(at("planted"), 0755), 0);
    cr_assert_eq(chown(at("planted"), OTHER_UID, OTHER_UID), 0);
    int fd = dk_logdir_open(at("planted"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert_eq(errno, EACCES);
    cr_assert(strstr(err, "refusing to use") && strstr(err, "planted for code") &&
              strstr(err, "belongs to another user"), "%s", err);
    /* nor from below it: the other user could rename what is in it */
    cr_assert_eq(mkdir(at("planted/mine"), 0755), 0);
    fd = dk_logdir_open(at("planted/mine"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert(strstr(err, "planted for code"), "%s", err);
    fd = open(at("egg.zip"), O_CREAT | O_WRONLY, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fchown(fd, OTHER_UID, OTHER_UID), 0);
    close(fd);
    fd = dk_logdir_open(at("egg.zip"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert(strstr(err, "belongs to another user"), "%s", err);
}

Test(logdir, a_missing_place_for_code_is_enoent_not_a_refusal)
{
    int fd = dk_logdir_open(at("nowhere/lib"), DK_LOGDIR_CODE, NULL, err, sizeof err);
    cr_assert_lt(fd, 0);
    cr_assert_eq(errno, ENOENT, "%s", err);
    cr_assert(!exists(at("nowhere")), "a place for code was created");
}

/* ---- a search path's entries (dk_codepath: PYTHONPATH on another node) ---- */

typedef struct {
    char text[4096];
    int n;
} heard_t;

static void hear(void *data, const char *entry, const char *why)
{
    heard_t *h = data;
    size_t len = strlen(h->text);
    snprintf(h->text + len, sizeof h->text - len, "%s => %s\n", entry, why);
    h->n++;
}

Test(logdir, a_search_path_keeps_the_users_folders_in_order_and_says_what_it_left_out)
{
    cr_assert_eq(mkdir(at("a"), 0755), 0);
    cr_assert_eq(mkdir(at("b"), 0700), 0);
    cr_assert_eq(mkdir(at("open"), 0777), 0);
    cr_assert_eq(chmod(at("open"), 0777), 0);
    char list[4096], want[2048];
    snprintf(list, sizeof list, "%s::%s:relative/lib:%s:%s:/usr/lib/python3/dist-packages",
             at("a"), at("missing"), at("open"), at("b"));
    snprintf(want, sizeof want, "%s:%s:/usr/lib/python3/dist-packages", at("a"), at("b"));
    heard_t h = {.n = 0};
    char *kept = dk_codepath_filter(list, hear, &h);
    cr_assert_not_null(kept);
    cr_assert_str_eq(kept, want);
    free(kept);
    /* the missing and the empty entries without a word; the relative one and
     * the one others can write, each named with why */
    cr_assert_eq(h.n, 2, "%s", h.text);
    cr_assert(strstr(h.text, "relative/lib => relative/lib is a relative folder"), "%s", h.text);
    cr_assert(strstr(h.text, "writable by other users") && strstr(h.text, at("open")), "%s",
              h.text);
}

Test(logdir, a_search_path_leaves_out_a_folder_another_user_made)
{
    if (geteuid() != 0)
        cr_skip_test("chown needs root");
    cr_assert_eq(mkdir(at("planted"), 0755), 0);
    cr_assert_eq(chown(at("planted"), OTHER_UID, OTHER_UID), 0);
    heard_t h = {.n = 0};
    char *kept = dk_codepath_filter(at("planted"), hear, &h);
    cr_assert_not_null(kept);
    cr_assert_str_eq(kept, "");
    free(kept);
    cr_assert_eq(h.n, 1, "%s", h.text);
    cr_assert(strstr(h.text, "belongs to another user"), "%s", h.text);
}
