/* For test_pyload: a library that needs a Python symbol no CPython has. */
int PyDK_NotInAnyCPython(void);
int dk_needs(void);
int dk_needs(void)
{
    return PyDK_NotInAnyCPython();
}
