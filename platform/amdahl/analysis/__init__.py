"""Pure analysis below search and report: figures with spread (stats), configurations (configs),
scaling curves and the Amdahl fit (scaling), the interconnect's alpha-beta model (alphabeta),
MFU and cost (cost), calibration.json's values (calibration), and the step-time model: what each
sync strategy communicates (comm), measured points (points), the fit (stepmodel) and its
predictions (prediction)."""
