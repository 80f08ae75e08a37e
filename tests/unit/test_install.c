/*
 * `distkernel install` (app/dk_install.h): its command line, the probe of a
 * python and the check of what it says (app/dk_pyprobe.h), where the kernelspec goes and what
 * it holds. The probe runs Debian's real python once, so that the fake
 * pythons of the end-to-end refusals (tests/e2e/test_environments.py) answer
 * in the format a real one does.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dk_install.h"
#include "dk_pyprobe.h"

static char err[2048];

static int parse(dk_install_opts_t *o, int argc, char *const *argv)
{
    err[0] = '\0';
    return dk_install_parse(argc, argv, o, err, sizeof err);
}

/* -- the command line -- */

Test(install, no_options_are_ipykernels_defaults)
{
    dk_install_opts_t o;
    cr_assert_eq(parse(&o, 0, NULL), 0, "%s", err);
    cr_assert_str_eq(o.name, "distkernel");
    cr_assert(!o.user && !o.sys_prefix && !o.help);
    cr_assert_null(o.prefix);
    cr_assert_null(o.python);
    cr_assert_null(o.display_name);
    cr_assert_eq(o.n_env, 0);
    dk_install_opts_clear(&o);
}

Test(install, every_option_in_both_spellings)
{
    char *argv[] = {"--user", "--name", "myenv", "--display-name=Python (myenv)",
                    "--python=/e/bin/python", "--env", "A", "1", "--env", "B", "x y"};
    dk_install_opts_t o;
    cr_assert_eq(parse(&o, 11, argv), 0, "%s", err);
    cr_assert(o.user);
    cr_assert_str_eq(o.name, "myenv");
    cr_assert_str_eq(o.display_name, "Python (myenv)");
    cr_assert_str_eq(o.python, "/e/bin/python");
    cr_assert_eq(o.n_env, 2);
    cr_assert_str_eq(o.env[1].name, "B");
    cr_assert_str_eq(o.env[1].value, "x y");
    dk_install_opts_clear(&o);
}

Test(install, a_variable_given_twice_keeps_its_last_value)
{
    char *argv[] = {"--env", "A", "1", "--env", "A", "2"};
    dk_install_opts_t o;
    cr_assert_eq(parse(&o, 6, argv), 0, "%s", err);
    cr_assert_eq(o.n_env, 1);
    cr_assert_str_eq(o.env[0].value, "2");
    dk_install_opts_clear(&o);
}

Test(install, sys_prefix_and_prefix_the_later_wins)
{
    char *a[] = {"--prefix", "/p", "--sys-prefix"}, *b[] = {"--sys-prefix", "--prefix", "/p"};
    dk_install_opts_t o;
    cr_assert_eq(parse(&o, 3, a), 0);
    cr_assert(o.sys_prefix && !o.prefix);
    dk_install_opts_clear(&o);
    cr_assert_eq(parse(&o, 3, b), 0);
    cr_assert(!o.sys_prefix && strcmp(o.prefix, "/p") == 0);
    dk_install_opts_clear(&o);
}

Test(install, user_and_a_prefix_is_refused)
{
    char *a[] = {"--user", "--prefix", "/p"}, *b[] = {"--sys-prefix", "--user"};
    dk_install_opts_t o;
    cr_assert_eq(parse(&o, 3, a), -1);
    cr_assert(strstr(err, "--user and --prefix"), "%s", err);
    cr_assert_eq(parse(&o, 2, b), -1);
    cr_assert(strstr(err, "--user and --sys-prefix"), "%s", err);
}

Test(install, a_missing_value_or_unknown_word_is_named)
{
    char *a[] = {"--name"}, *b[] = {"--env", "A"}, *c[] = {"--frobnicate"},
         *d[] = {"--env", "A=B", "1"};
    dk_install_opts_t o;
    cr_assert_eq(parse(&o, 1, a), -1);
    cr_assert(strstr(err, "--name needs a value"), "%s", err);
    cr_assert_eq(parse(&o, 2, b), -1);
    cr_assert(strstr(err, "--env VAR VALUE"), "%s", err);
    cr_assert_eq(parse(&o, 1, c), -1);
    cr_assert(strstr(err, "'--frobnicate'"), "%s", err);
    cr_assert_eq(parse(&o, 3, d), -1);
    cr_assert(strstr(err, "'A=B'"), "%s", err);
}

Test(install, the_name_is_lower_cased_and_checked_as_jupyter_client_does)
{
    char *n = dk_install_kernel_name("My.Env_2-x", err, sizeof err);
    cr_assert_str_eq(n, "my.env_2-x");
    free(n);
    cr_assert_null(dk_install_kernel_name("my env", err, sizeof err));
    cr_assert(strstr(err, "invalid kernel name 'my env'"), "%s", err);
    cr_assert_null(dk_install_kernel_name("../x", err, sizeof err));
    cr_assert_null(dk_install_kernel_name("", err, sizeof err));
}

Test(install, the_display_name_says_the_version_and_the_environment)
{
    dk_install_opts_t o = {.name = "distkernel"};
    cr_assert_str_eq(dk_install_display_name(&o, "distkernel", "3.12", "proj"),
                     "distkernel (Python 3.12, proj)");
    cr_assert_str_eq(dk_install_display_name(&o, "myenv", "3.12", "proj"), "Python 3.12 (myenv)");
    o.display_name = "Mine";
    cr_assert_str_eq(dk_install_display_name(&o, "myenv", "3.12", "proj"), "Mine");
}

Test(install, an_environment_is_called_by_its_folder_or_its_projects)
{
    cr_assert_str_eq(dk_install_env_label("/home/u/envs/torch2", "conda"), "torch2");
    cr_assert_str_eq(dk_install_env_label("/home/u/proj/.venv", "venv"), "proj");
    cr_assert_str_eq(dk_install_env_label("/home/u/proj/venv/", "venv"), "proj");
    cr_assert_str_eq(dk_install_env_label("/root/.pyenv/versions/3.12.1", "installation"),
                     "3.12.1");
    cr_assert_str_eq(dk_install_env_label("/usr", "installation"), "system");
    cr_assert_str_eq(dk_install_env_label("/venv", "venv"), "venv");
}

/* -- the probe and the check -- */

static const char good[] = "distkernel-probe 1\nversion 3.11\n"
                           "soabi cpython-311-x86_64-linux-gnu\nprefix /e\nmissing \n";

Test(install, the_probe_of_a_real_python_parses)
{
    dk_pyprobe_t p;
    cr_assert_eq(dk_pyprobe_run(PYTHON3, &p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(p.major, 3);
    cr_assert_str_eq(p.prefix, "/usr");
    cr_assert(strncmp(p.soabi, "cpython-3", 9) == 0, "%s", p.soabi);
    cr_assert_str_eq(p.missing, "");
    cr_assert(p.debugpy, "Debian's python3-debugpy is installed (scripts/deps.sh)");
    dk_pyprobe_clear(&p);
}

Test(install, the_probe_says_whether_debugpy_is_there)
{
    dk_pyprobe_t p;
    char text[256];
    snprintf(text, sizeof text, "%sdebugpy yes\n", good);
    cr_assert_eq(dk_pyprobe_parse(text, &p, err, sizeof err), 0, "%s", err);
    cr_assert(p.debugpy);
    dk_pyprobe_clear(&p);
    snprintf(text, sizeof text, "%sdebugpy no\n", good);
    cr_assert_eq(dk_pyprobe_parse(text, &p, err, sizeof err), 0, "%s", err);
    cr_assert(!p.debugpy);
    dk_pyprobe_clear(&p);
    cr_assert_eq(dk_pyprobe_parse(good, &p, err, sizeof err), 0, "%s", err);
    cr_assert(!p.debugpy, "no line, no debugger");
    dk_pyprobe_clear(&p);
}

Test(install, a_program_that_says_something_else_is_not_a_python)
{
    dk_pyprobe_t p;
    cr_assert_eq(dk_pyprobe_run("/bin/echo", &p, err, sizeof err), -1);
    cr_assert(strstr(err, "/bin/echo is not a Python"), "%s", err);
    cr_assert_eq(dk_pyprobe_run("/nonexistent/python", &p, err, sizeof err), -1);
    cr_assert(strstr(err, "/nonexistent/python is not a Python: No such file"), "%s", err);
    cr_assert_eq(dk_pyprobe_run("/tmp", &p, err, sizeof err), -1);
    cr_assert(strstr(err, "not an executable file"), "%s", err);
}

Test(install, an_incomplete_or_odd_answer_is_refused)
{
    dk_pyprobe_t p;
    cr_assert_eq(dk_pyprobe_parse(good, &p, err, sizeof err), 0, "%s", err);
    dk_pyprobe_clear(&p);
    cr_assert_eq(dk_pyprobe_parse("distkernel-probe 1\nversion 3.11\n", &p, err, sizeof err),
                 -1);
    cr_assert_eq(dk_pyprobe_parse("Python 3.11.2\n", &p, err, sizeof err), -1);
    cr_assert_eq(dk_pyprobe_parse("distkernel-probe 1\nversion 3.x\nsoabi \nprefix /e\n"
                                  "missing \n", &p, err, sizeof err), -1);
    cr_assert_eq(dk_pyprobe_parse("", &p, err, sizeof err), -1);
}

static dk_pyprobe_t probe_of(const char *text)
{
    dk_pyprobe_t p;
    cr_assert_eq(dk_pyprobe_parse(text, &p, err, sizeof err), 0, "%s", err);
    return p;
}

/* A probe's answer: VERSION, then the lines after "prefix". */
static dk_pyprobe_t probe_with(const char *version, const char *rest)
{
    char text[1024];
    snprintf(text, sizeof text,
             "distkernel-probe 1\nversion %s\nsoabi cpython-x\nprefix /e\n%s", version, rest);
    return probe_of(text);
}

#define SHARED "implementation cpython\nkind venv\nbase /b\nfreethreaded no\n" \
               "libpython /b/lib/libpython3.12.so.1.0\nmissing \n"

Test(install, any_cpython_from_3_10_with_a_shared_library_and_the_modules_passes)
{
    const char *versions[] = {"3.10", "3.11", "3.12", "3.13", "3.14"};
    for (size_t i = 0; i < 5; i++) {
        dk_pyprobe_t p = probe_with(versions[i], SHARED);
        cr_assert_eq(dk_pyprobe_check(&p, "/e/bin/python", err, sizeof err), 0, "%s", err);
        cr_assert_str_eq(p.libpython, "/b/lib/libpython3.12.so.1.0");
        cr_assert_str_eq(p.kind, "venv");
        dk_pyprobe_clear(&p);
    }
}

Test(install, a_python_older_than_3_10_is_refused_naming_the_oldest)
{
    const char *versions[] = {"3.9", "3.1", "2.7"};
    for (size_t i = 0; i < 3; i++) {
        dk_pyprobe_t p = probe_with(versions[i], SHARED);
        cr_assert_eq(dk_pyprobe_check(&p, "/e/bin/python", err, sizeof err), -1);
        cr_assert(strstr(err, "older than the oldest distkernel runs on (3.10)"), "%s", err);
        dk_pyprobe_clear(&p);
    }
}

Test(install, a_static_build_is_refused_with_how_to_get_a_shared_one)
{
    dk_pyprobe_t p = probe_with("3.12", "implementation cpython\nkind installation\nbase /e\n"
                                        "freethreaded no\nlibpython \nmissing \n");
    cr_assert_eq(dk_pyprobe_check(&p, "/e/bin/python", err, sizeof err), -1);
    cr_assert(strstr(err, "without a shared libpython"), "%s", err);
    cr_assert(strstr(err, "--enable-shared"), "%s", err);
    dk_pyprobe_clear(&p);
}

Test(install, a_free_threaded_build_and_pypy_are_refused)
{
    dk_pyprobe_t p = probe_with("3.13", "implementation cpython\nkind installation\nbase /e\n"
                                        "freethreaded yes\nlibpython /e/lib/libpython3.13t.so\n"
                                        "missing \n");
    cr_assert_eq(dk_pyprobe_check(&p, "/e/bin/python", err, sizeof err), -1);
    cr_assert(strstr(err, "free-threaded Python 3.13"), "%s", err);
    cr_assert(strstr(err, "python3.13, not python3.13t"), "%s", err);
    dk_pyprobe_clear(&p);
    p = probe_with("3.10", "implementation pypy\nkind installation\nbase /e\n"
                           "freethreaded no\nlibpython \nmissing \n");
    cr_assert_eq(dk_pyprobe_check(&p, "/e/bin/python", err, sizeof err), -1);
    cr_assert(strstr(err, "is pypy 3.10, not CPython"), "%s", err);
    dk_pyprobe_clear(&p);
}

Test(install, missing_modules_are_listed_with_how_to_add_them)
{
    dk_pyprobe_t p = probe_with("3.11", "libpython /b/libpython3.11.so\n"
                                        "missing IPython cloudpickle\n");
    cr_assert_eq(dk_pyprobe_check(&p, "/e/bin/python", err, sizeof err), -1);
    cr_assert(strstr(err, "lacks what the kernel needs: IPython cloudpickle"), "%s", err);
    cr_assert(strstr(err, "/e/bin/python -m pip install ipython cloudpickle"), "%s", err);
    dk_pyprobe_clear(&p);
}

/* -- where it goes -- */

static char *dest_for(dk_install_opts_t *o)
{
    char *d = dk_install_destination(o, "myenv", "/env", err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    return d;
}

Test(install, the_destination_follows_kernelspecmanager)
{
    dk_install_opts_t o = {.name = "myenv"};
    char *d = dest_for(&o);
    cr_assert_str_eq(d, "/usr/local/share/jupyter/kernels/myenv");
    free(d);
    o.prefix = "/opt/x/";
    d = dest_for(&o);
    cr_assert_str_eq(d, "/opt/x/share/jupyter/kernels/myenv");
    free(d);
    o.prefix = NULL;
    o.sys_prefix = true;
    d = dest_for(&o);
    cr_assert_str_eq(d, "/env/share/jupyter/kernels/myenv");
    free(d);
}

Test(install, a_relative_prefix_is_made_absolute)
{
    char cwd[4096], want[4200];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    snprintf(want, sizeof want, "%s/rel/share/jupyter/kernels/myenv", cwd);
    dk_install_opts_t o = {.name = "myenv", .prefix = "rel"};
    char *d = dest_for(&o);
    cr_assert_str_eq(d, want);
    free(d);
}

Test(install, user_is_jupyter_data_dir_then_xdg_then_home)
{
    dk_install_opts_t o = {.name = "myenv", .user = true};
    setenv("JUPYTER_DATA_DIR", "/jd", 1);
    setenv("XDG_DATA_HOME", "/xdg", 1);
    setenv("HOME", "/nonexistent-home", 1);
    char *d = dest_for(&o);
    cr_assert_str_eq(d, "/jd/kernels/myenv");
    free(d);
    unsetenv("JUPYTER_DATA_DIR");
    d = dest_for(&o);
    cr_assert_str_eq(d, "/xdg/jupyter/kernels/myenv");
    free(d);
    unsetenv("XDG_DATA_HOME");
    d = dest_for(&o);
    cr_assert_str_eq(d, "/nonexistent-home/.local/share/jupyter/kernels/myenv");
    free(d);
}

/* -- what it holds -- */

Test(install, the_spec_runs_the_kernel_with_the_environments_python)
{
    dk_install_env_t env[] = {{"A", "1"}};
    char *text = dk_install_spec_json("/k/distkernel", "/e/bin/python",
                                      "/b/lib/libpython3.12.so.1.0", "myenv", true, env, 1);
    cr_assert_not_null(text);
    json_t *spec = json_loads(text, 0, NULL);
    cr_assert_not_null(spec);
    json_t *argv = json_object_get(spec, "argv");
    const char *want[] = {"/k/distkernel", "--python", "/e/bin/python", "--libpython",
                          "/b/lib/libpython3.12.so.1.0", "-f", "{connection_file}"};
    cr_assert_eq(json_array_size(argv), 7);
    for (size_t i = 0; i < 7; i++)
        cr_assert_str_eq(json_string_value(json_array_get(argv, i)), want[i]);
    cr_assert_str_eq(json_string_value(json_object_get(spec, "display_name")), "myenv");
    cr_assert_str_eq(json_string_value(json_object_get(spec, "language")), "python");
    cr_assert_str_eq(json_string_value(json_object_get(spec, "interrupt_mode")), "message");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(spec, "env"), "A")), "1");
    /* JupyterLab 4 offers its debugger only for a spec that says so */
    cr_assert(json_is_true(json_object_get(json_object_get(spec, "metadata"), "debugger")));
    json_decref(spec);
    free(text);
}

Test(install, without_a_python_the_spec_names_none_and_has_no_env)
{
    char *text = dk_install_spec_json("/k/distkernel", NULL, NULL, "d", false, NULL, 0);
    json_t *spec = json_loads(text, 0, NULL);
    cr_assert_eq(json_array_size(json_object_get(spec, "argv")), 3);
    cr_assert_null(json_object_get(spec, "env"));
    cr_assert(json_is_false(json_object_get(json_object_get(spec, "metadata"), "debugger")));
    json_decref(spec);
    free(text);
}

/* -- writing it -- */

static char tmp[64];

static void make_tmp(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/dk-test-install-XXXXXX");
    cr_assert_not_null(mkdtemp(tmp));
}

static void remove_tmp(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

Test(install, write_creates_the_folders_and_replaces_a_spec_there, .init = make_tmp,
     .fini = remove_tmp)
{
    char dest[256], file[300];
    snprintf(dest, sizeof dest, "%s/a/b/kernels/myenv", tmp);
    cr_assert_eq(dk_install_write(dest, "{\"v\": 1}", LOGO_DIR, false, err, sizeof err), 0, "%s",
                 err);
    snprintf(file, sizeof file, "%s/stale", dest);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(dk_install_write(dest, "{\"v\": 2}", LOGO_DIR, false, err, sizeof err), 0, "%s",
                 err);
    cr_assert_neq(access(file, F_OK), 0, "the old kernelspec's files are gone");
    snprintf(file, sizeof file, "%s/kernel.json", dest);
    json_t *spec = json_load_file(file, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(spec, "v")), 2);
    json_decref(spec);
    snprintf(file, sizeof file, "%s/logo-64x64.png", dest);
    struct stat st;
    cr_assert_eq(stat(file, &st), 0);
    cr_assert_gt(st.st_size, 0);
    cr_assert_eq(stat(dest, &st), 0);
    cr_assert(st.st_mode & S_IROTH, "a kernelspec others can read (mode %o)", st.st_mode);
}

Test(install, a_failed_write_leaves_nothing, .init = make_tmp, .fini = remove_tmp)
{
    char dest[256], parent[256];
    snprintf(dest, sizeof dest, "%s/kernels/myenv", tmp);
    cr_assert_eq(dk_install_write(dest, "{}", "/nonexistent-logos", false, err, sizeof err), -1);
    cr_assert(strstr(err, "logo"), "%s", err);
    snprintf(parent, sizeof parent, "%s/kernels", tmp);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", parent);
    cr_assert_eq(system(cmd), 0, "the kernels folder is empty");
}

Test(install, an_unwritable_place_says_to_try_user, .init = make_tmp, .fini = remove_tmp)
{
    if (geteuid() == 0)
        cr_skip_test("root writes anywhere");
    char dest[256];
    chmod(tmp, 0500);
    snprintf(dest, sizeof dest, "%s/kernels/myenv", tmp);
    cr_assert_eq(dk_install_write(dest, "{}", LOGO_DIR, false, err, sizeof err), -1);
    chmod(tmp, 0700);
    cr_assert(strstr(err, "--user"), "%s", err);
}
