// Open a notebook in Jupyter Notebook 6 in Chromium, run all its cells, wait
// until every cell has run and the page shows WAIT_FOR, then screenshot the
// notebook's cells (not the page's empty margins) at a readable width.
// Usage: node shot.js URL OUT.png WAIT_FOR   (PLAYWRIGHT: playwright-core's folder)
const { chromium } = require(process.env.PLAYWRIGHT || 'playwright-core');
(async () => {
  const [url, out, waitFor] = process.argv.slice(2);
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
                                          args: ['--no-sandbox'] });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(url);
  await page.waitForFunction(() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel &&
                             Jupyter.notebook.kernel.is_connected(), null, { timeout: 60000 });
  await page.evaluate(() => Jupyter.notebook.execute_all_cells());
  await page.waitForFunction((w) => document.body.innerText.includes(w), waitFor, { timeout: 180000 });
  await page.waitForFunction(() => Jupyter.notebook.get_cells().every(c => c.input_prompt_number !== '*'),
                             null, { timeout: 180000 });
  // The notebook, without the header's toolbars and the page below the last cell.
  await page.evaluate(() => { Jupyter.notebook.select(0); document.activeElement.blur();
                              document.querySelectorAll('.cell').forEach(c => c.classList.remove('selected')); });
  await page.waitForTimeout(300);
  const box = await page.evaluate(() => {
    const cells = Array.from(document.querySelectorAll('#notebook-container .cell'));
    const first = cells[0].getBoundingClientRect(), last = cells[cells.length - 1].getBoundingClientRect();
    const c = document.querySelector('#notebook-container').getBoundingClientRect();
    return { x: c.left, y: first.top + window.scrollY - 8, width: c.width,
             height: last.bottom - first.top + 16 };
  });
  await page.screenshot({ path: out, fullPage: true, clip: box });
  const text = await page.evaluate(() => Array.from(document.querySelectorAll('.output_area'))
                                              .map(e => e.innerText).join('\n----\n'));
  console.log(text);
  await browser.close();
})().catch(e => { console.error(e); process.exit(1); });
