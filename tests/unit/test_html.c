/*
 * Text placed in HTML (runtime/base/dk_html.h): every character that could end an
 * element's text or a quoted attribute comes out as a reference.
 */
#include <criterion/criterion.h>

#include <stdlib.h>

#include "dk_html.h"

static void escapes_to(const char *in, const char *want)
{
    char *out = dk_html_escape(in);
    cr_assert_not_null(out);
    cr_assert_str_eq(out, want);
    free(out);
}

Test(html, plain_text_is_unchanged)
{
    escapes_to("distributed-2xcpu-20261202-155500", "distributed-2xcpu-20261202-155500");
}

Test(html, the_five_markup_characters_become_references)
{
    escapes_to("&<>\"'", "&amp;&lt;&gt;&quot;&#39;");
}

Test(html, an_attribute_breakout_stays_inside_the_attribute)
{
    escapes_to("http://h/#/runs/\"><img src=x onerror=alert(1)>",
               "http://h/#/runs/&quot;&gt;&lt;img src=x onerror=alert(1)&gt;");
}

Test(html, an_existing_reference_is_escaped_again)
{
    escapes_to("&amp;", "&amp;amp;");
}

Test(html, utf8_passes_through)
{
    escapes_to("r\xc3\xa9sum\xc3\xa9 \xe2\x80\x94 run", "r\xc3\xa9sum\xc3\xa9 \xe2\x80\x94 run");
}

Test(html, null_is_the_empty_string)
{
    escapes_to(NULL, "");
}
