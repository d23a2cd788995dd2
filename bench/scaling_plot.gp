# Plots the model rows that `scaling_study --csv FILE` writes: time per exchange and bytes received per node
# against the number of nodes, at d = 2^24, densities 1e-3 and 1e-2, 1 Gbit/s.
#   gnuplot -e "csv='scaling.csv'; png='scaling.png'" bench/scaling_plot.gp
if (!exists("csv")) csv = 'scaling.csv'
if (!exists("png")) png = 'scaling.png'
set datafile separator ','
set terminal pngcairo size 1200,900 font ',10'
set output png
set logscale xy
set xtics (8, 16, 32, 64, 128, 256, 512, 1024)
set xrange [6:1400]
set key top left
set grid
set multiplot layout 2,2 title 'dense ring, all-gather top-k, sparse all-reduce and PowerSGD rank 2 (model, d = 2^{24}, 1 Gbit/s, alpha = 50 us)'
d = 16777216
sel(den, col) = (column(1) == d && abs(column(2) - den) < den * 1e-6) ? column(col) : 1/0
do for [den in "0.001 0.01"] {
  dd = den + 0
  set title sprintf('time per exchange, density %s', den)
  set xlabel 'nodes'
  set ylabel 'ms'
  plot csv every ::1 using 3:(sel(dd, 8)) with linespoints title 'dense ring', \
       csv every ::1 using 3:(sel(dd, 9)) with linespoints title 'all-gather top-k', \
       csv every ::1 using 3:(sel(dd, 10)) with linespoints title 'sparse all-reduce', \
       csv every ::1 using 3:(sel(dd, 11)) with linespoints title 'PowerSGD r=2'
  set title sprintf('received per node, density %s', den)
  set ylabel 'KiB'
  plot csv every ::1 using 3:(sel(dd, 4)) with linespoints title 'dense ring', \
       csv every ::1 using 3:(sel(dd, 5)) with linespoints title 'all-gather top-k', \
       csv every ::1 using 3:(sel(dd, 6)) with linespoints title 'sparse all-reduce', \
       csv every ::1 using 3:(sel(dd, 7)) with linespoints title 'PowerSGD r=2'
}
unset multiplot
