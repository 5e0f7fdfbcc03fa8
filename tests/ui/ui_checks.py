"""What the browser tests look for on a run page (shared by the live page and the report)."""

CHARTS = ("loss", "grad", "lr", "update", "speed", "memory", "steptime", "heat_grad",
          "heat_update", "quantiles", "heat_act", "heat_zero", "category")

# Distinct colours drawn on each chart's canvases (sampled): an empty canvas has none.
CANVAS_COLOURS = """
const out = {};
for (const card of document.querySelectorAll('#charts .card')) {
  const seen = new Set();
  for (const c of card.querySelectorAll('canvas')) {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    for (let i = 0; i < d.length; i += 4 * 5) if (d[i + 3] > 0) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
  }
  out[card.dataset.chart] = {shown: card.style.display !== 'none', colours: seen.size};
}
return out;
"""


def wait(driver, seconds: float, poll_frequency: float = 0.5):
    """``WebDriverWait`` that also looks again when the page re-renders the element it read
    (StaleElementReference): the pages redraw on every poll, so a lookup can race one."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, seconds, poll_frequency, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException))
