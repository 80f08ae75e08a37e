/* For test_pyload: a library with one entry and no Python in it. */
int dk_plain(void);
int dk_plain(void)
{
    return 42;
}
